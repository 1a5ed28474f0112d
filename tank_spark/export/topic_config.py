"""Each exported topic's broker `config` (§1.5), kept in the Delta table so that an import gives the topic back its
policy and limits (a `cleanup` topic must not come back as `delete`).

The text of `<base>/<topic>/config` goes into the commit info of every export commit that carries the topic's rows,
as `tank_log.topic_config.<topic>` (beside the run id). Commit info is free-form: every Delta reader ignores keys
it does not know, and the commit adds no version of its own (a table property would: delta-rs refuses unknown
properties when it creates a table, so they would need a metadata commit after each export's). The newest commit
that carries a topic's key holds its config as of that export; the import reads back `LOOKBACK` commits (a topic
exported less recently than that, or whose commits the log's retention expired, is reported as not restored).
A partition-level `config` (`<base>/<topic>/<N>/config`, §1.5) is recorded the same way, as
`tank_log.topic_config.<topic>/<N>` (a topic name never holds a `/`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

log = logging.getLogger(__name__)

PREFIX = "tank_log.topic_config."
LOOKBACK = 1000  # commits the import reads back for the topics' configs


def topic_config_metadata(topics: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The commit info entries recording the `config` text of each (base path, topic): a topic without a `config`
    file, or with one that is not UTF-8, is left out (logged). The first base path of a topic wins."""
    out: dict[str, str] = {}
    for key, path in _config_files(topics):
        try:
            with open(path, "rb") as fh:
                text = fh.read().decode("utf-8")
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError) as err:
            log.warning("export: %s not recorded in the table: %s", path, err)
            continue
        out.setdefault(PREFIX + key, text)
    return out


def _config_files(topics: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """(key, file) of each topic's `config` (key: the topic) and its partitions' (key: `<topic>/<N>`), by base path
    and topic."""
    out = []
    for base, topic in sorted(set(topics)):
        tdir = os.path.join(base, topic)
        out.append((topic, os.path.join(tdir, "config")))
        try:
            ids = sorted(int(n) for n in os.listdir(tdir) if n.isascii() and n.isdigit())
        except OSError:
            continue
        out += [(f"{topic}/{i}", os.path.join(tdir, str(i), "config")) for i in ids]
    return out


def recorded_topic_configs(history: Iterable[dict[str, Any]]) -> dict[str, str]:
    """topic (or `<topic>/<N>`) → its recorded `config` text, from a table's commit infos, newest first (the newest
    wins)."""
    out: dict[str, str] = {}
    for commit in history:
        for key, value in commit.items():
            if key.startswith(PREFIX) and isinstance(value, str):
                out.setdefault(key[len(PREFIX) :], value)
    return out
