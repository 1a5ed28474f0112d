"""Compaction's check that no other process holds the partition (`storage.holders`), at the cost a one-partition run
should pay: the scan's first check searches every process's `maps` as read, without parsing them; a second check
of the same scan indexes them. A process mapping an index is found either way, with real processes."""

from __future__ import annotations

import glob
import os
import sys

from conftest import Detached

from tank_log.format.bundle import Message
from tank_log.storage import holders as module
from tank_log.storage.holders import partition_holders
from tank_log.storage.partition_writer import write_partition

MAPS_ONE = (  # maps the file HOLD, with no descriptor left open on it
    "import mmap, os, time; t = os.environ['HOLD']; f = open(t, 'rb'); "
    "m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ); f.close(); "
    "[os.close(int(fd)) for fd in os.listdir('/proc/self/fd') if os.path.realpath(f'/proc/self/fd/{fd}') == t]; "
    "print('ready', flush=True); time.sleep(600)"
)


class CountedMaps:
    """`holders._MAPPED` counting the `maps` texts parsed."""

    def __init__(self) -> None:
        self.parsed = 0

    def findall(self, text: bytes) -> list[bytes]:
        self.parsed += 1
        return list(PATTERN.findall(text))


PATTERN = module._MAPPED


def test_one_check_parses_no_maps_and_a_mapping_holder_is_found_first_and_later(tmp_path, monkeypatch):
    base = str(tmp_path / "base")
    msgs = [Message(s, 1_700_000_000_000 + s, b"k", b"v%d" % s) for s in range(1, 41)]
    for pid in (1, 10):
        write_partition(os.path.join(base, "t", str(pid)), msgs, segment_bytes=200)
    index = {
        pid: os.path.realpath(sorted(glob.glob(os.path.join(base, "t", str(pid), "*.index")))[0]) for pid in (1, 10)
    }
    counted = CountedMaps()
    monkeypatch.setattr(module, "_MAPPED", counted)
    monkeypatch.setattr(module, "RESCAN_S", 600.0)  # one scan for the whole test
    monkeypatch.setattr(module, "_scan", None)
    first = Detached([sys.executable, "-c", MAPS_ONE], dict(os.environ, HOLD=index[10]))
    later = None
    try:
        (held,) = partition_holders(os.path.join(base, "t", "10"))  # the scan, and its first check
        assert held.pid == first.pid and held.how.startswith("maps ")
        assert counted.parsed == 1  # the holder's own maps, read again; no other process's
        later = Detached([sys.executable, "-c", MAPS_ONE], dict(os.environ, HOLD=index[1]))  # after the scan
        (held,) = partition_holders(os.path.join(base, "t", "1"))  # the second check: the index
        assert held.pid == later.pid and held.how.startswith("maps ")
        assert counted.parsed > 3  # every process's maps, indexed
        (held,) = partition_holders(os.path.join(base, "t", "10"))
        assert held.pid == first.pid
    finally:
        first.kill()
        if later is not None:
            later.kill()
