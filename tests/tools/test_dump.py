"""`tank-log dump` formats chunks on other threads (compiled core): the lines come out in order, the same as the
pure-Python core's, across many chunks, segments and partitions."""

import io
import os
from contextlib import redirect_stdout

from tank_log.format import native
from tank_log.format.bundle import Message
from tank_log.storage.partition_writer import write_partition
from tank_log.storage.writer import BundlePolicy
from tank_log.tools import dump
from tank_log.tools.cli import main


def test_lines_in_order_across_chunks_segments_and_partitions(tmp_path, monkeypatch):
    base = str(tmp_path)
    for pid in range(2):
        msgs = (
            Message(i + 1, 1_700_000_000_000 + i, b"k%d" % (i % 97) if i % 5 else None, b'v"%d\\' % i * (i % 7))
            for i in range(20_000)
        )
        write_partition(os.path.join(base, "t", str(pid)), msgs, segment_bytes=64 << 10, policy=BundlePolicy(30))
    monkeypatch.setattr(dump, "CHUNK_BYTES", 8 << 10)  # many chunks per segment: a deep pipeline
    outputs = []
    for pure in (False, True):
        with native.use_pure(pure):
            buf = io.StringIO()
            with redirect_stdout(buf):
                assert main(["dump", base]) == 0
            outputs.append(buf.getvalue())
    assert outputs[0] == outputs[1]
    lines = outputs[0].splitlines()
    assert len(lines) == 40_000
    assert lines[0].startswith('{"topic":"t","partition":0,"seq":1,') and '"partition":1,"seq":20000,' in lines[-1]
    seqs = [int(line.split('"seq":')[1].split(",")[0]) for line in lines]
    assert seqs == list(range(1, 20_001)) * 2
