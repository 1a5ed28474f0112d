"""The stand-in broker's `--life` (tank_log/tools/standin_broker.py): a MODEL of what the broker's produce path does
to a partition's files — rolls (docs/FORMAT.md §2.4, §2.5) and its retention at each roll (§5). The real broker
(TANK_BIN) is the oracle; this is for machines without it, and must follow it, weaknesses included.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Sequence

from tank_log.format.bundle import Message
from tank_log.format.names import format_index_name, format_ro_name
from tank_log.storage.appender import PartitionAppender
from tank_log.storage.datadir import rescan_partition


def broker_retention(path: str, topic: str, pid: int, now_s: int) -> list[str]:
    """The broker's retention at a roll (docs/FORMAT.md §5, `consider_ro_segments`), as it does it: only with
    `log.cleanup.policy=delete`; while any limit holds, the FRONT RO segment goes — more RO segments than
    `retention.segments.count`, more RO bytes than `log.retention.bytes`, or the front segment's NAME ts (§2.2) plus
    `log.retention.secs` before now, a name without a ts (legacy, ts 0) never aged and blocking the rest; it unlinks
    `<base>-<last>_<ts>.ilog` (the name rebuilt with its ts: a legacy `<base>-<last>.ilog` stays on disk, orphaned,
    §11.11) and `<base>.index`. The names of what it unlinked.

    Not tank_log.maintenance.retention's planner: that one is better than the broker on purpose (legacy names aged
    by their messages and really deleted); this must be the broker. Sizes are real (see the module's note)."""
    part = rescan_partition(path, topic, pid)
    cfg = part.config
    if cfg.cleanup_policy != "delete":
        return []
    ro, gone = list(part.ro), []
    while ro:
        front = ro[0]
        count = cfg.retention_segments_count and len(ro) > cfg.retention_segments_count
        size = cfg.retention_bytes and sum(s.size for s in ro) > cfg.retention_bytes
        age = front.ts and cfg.retention_secs and front.ts + cfg.retention_secs < now_s
        if not (count or size or age):
            break
        assert front.last is not None
        for name in (format_ro_name(front.base, front.last, front.ts), format_index_name(front.base)):
            try:
                os.unlink(os.path.join(path, name))
                gone.append(name)
            except FileNotFoundError:  # the broker prints `Failed to unlink` and goes on
                pass
        ro.pop(0)
    return gone


class LifeAppender(PartitionAppender):
    """A PartitionAppender that also rolls by age (§2.4 rule 6) and applies the broker's retention after each roll
    of a non-empty active segment (§2.5 step 4, §5): `--life`'s model of the broker's produce path."""

    def __init__(self, path: str, topic: str, pid: int) -> None:
        super().__init__(path)
        self.topic, self.pid = topic, pid
        self.jitter = rescan_partition(path, topic, pid).config.roll_jitter_secs
        self.roll_age = self._roll_age()
        self.deleted: list[str] = []

    def _roll_age(self) -> int:
        """`rollJitterSecs`, drawn at every open and roll (§2.4): a week, or random up to the jitter, at least 1 h."""
        return 604800 if not self.jitter else max(random.randint(0, self.jitter), 3600)

    def append(self, messages: Sequence[Message]) -> None:
        active = self._active
        if active is not None and self._size > 0 and messages and messages[0].seq == self.last + 1:
            created = int(os.path.basename(active).split(".")[0].partition("_")[2] or time.time())
            if int(time.time()) - created > self.roll_age:  # rule 6, after rule 4 (size) which the base class applies
                self.roll(messages[0].seq)
        super().append(messages)

    def roll(self, first_seq: int) -> None:
        rolled = self._active is not None
        super().roll(first_seq)
        self.roll_age = self._roll_age()
        if rolled:
            self.deleted += broker_retention(self.path, self.topic, self.pid, int(time.time()))
