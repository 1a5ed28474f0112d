"""Every fixture written by the real broker decodes to exactly its dump (docs/FORMAT.md §3), through the library,
the Arrow path and `tank-log dump`; re-encoding its bundles with the same choices reproduces them."""

import io
from contextlib import redirect_stdout

import numpy as np
import pytest
from conftest import DATASETS, data_dir, load_dump, load_dump_lines

from tank_log.format.bundle import Codec, Message, encode_bundle, encode_message_set, frame
from tank_log.format.codecs.snappy import decompress
from tank_log.format.varint import decode_varint
from tank_log.maintenance.verify import verify_path
from tank_log.storage.datadir import partitions_at
from tank_log.tools.cli import main


def decoded(name):
    out = {}
    for part in partitions_at(data_dir(name)):
        rows = []
        for seg in part.segments:
            rows += [(m.seq, m.ts, m.key, m.value) for m in seg.messages()]
        if rows:
            out[part.key] = rows
    return out


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_library_decodes_exactly_the_dump(name, codec_core):
    assert decoded(name) == load_dump(name)


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_arrow_batches_equal_the_dump(name, codec_core):
    expected = load_dump(name)
    for part in partitions_at(data_dir(name)):
        rows = []
        for seg in part.segments:
            for batch in seg.batches(chunk_bytes=20000):  # small chunks: exercise chunk boundaries
                d = batch.to_pydict()
                rows += list(zip(d["seq"], d["ts"], d["key"], d["value"], strict=True))
        assert rows == expected.get(part.key, [])


def test_batches_come_in_the_decoded_chunks(codec_core, monkeypatch):
    """The batches read in one pass per message set (`Segment.batch_chunks`) come in the chunks the decoding walk
    makes, also where its message budget ends them (DEFAULT_MAX_MESSAGES, cut to 7 here): the same file offsets,
    bundles and messages; a seq range is cut from them."""
    from tank_log.format import decode

    monkeypatch.setattr(decode, "DEFAULT_MAX_MESSAGES", 7)
    budget_stops = 0
    for name in sorted(DATASETS):
        for part in partitions_at(data_dir(name)):
            for seg in part.segments:
                decoded = list(seg.chunks())
                read = list(seg.batch_chunks())
                assert [(c.file_offset, c.table.offsets.tolist()) for c in read] == [
                    (c.file_offset, c.table.offsets.tolist()) for c in decoded
                ]
                assert [c.seq.tolist() for c in read] == [c.cols.seq.tolist() for c in decoded]
                budget_stops += sum(int(c.table.counts[:-1].sum()) < 7 <= int(c.table.counts.sum()) for c in read)
                seqs = [s for c in decoded for s in c.cols.seq.tolist()]
                if len(seqs) > 2:
                    lo, hi = seqs[1], seqs[-2]
                    got = [s for b in seg.batches(min_seq=lo, max_seq=hi) for s in b.column("seq").to_pylist()]
                    assert got == [s for s in seqs if lo <= s <= hi]
    assert budget_stops > 20


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_cli_dump_is_byte_identical(name, codec_core):
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["dump", data_dir(name)]) == 0
    got: dict = {}
    import json

    for line in buf.getvalue().splitlines():
        o = json.loads(line)
        got.setdefault((o["topic"], o["partition"]), []).append(line)
    assert got == load_dump_lines(name)


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_verify_is_clean_on_every_fixture(name):
    problems = verify_path(data_dir(name))
    assert [p for p in problems if p.severity == "error"] == []


def test_seek_through_index():
    part = next(p for p in partitions_at(data_dir("A_multi")) if p.key == ("small", 0))
    seg = part.ro[2]
    mid = seg.base + 50
    table = seg.read_table(min_seq=mid, max_seq=mid + 9)
    assert table.column("seq").to_pylist() == list(range(mid, mid + 10))
    off, next_seq = seg.seek(mid)
    assert off > 0 and seg.base < next_seq <= mid  # the index got us past the start


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_reencoding_bundles_reproduces_them(name, codec_core):
    """Plain bundles: identical bytes. Snappy bundles: identical header and uncompressed message set; the
    compressed bytes depend on the Snappy implementation (python-snappy/cramjam vs the broker's libsnappy pick
    different matches for some blocks), which every Snappy decoder accepts."""
    snappy_total = snappy_same = 0
    for part in partitions_at(data_dir(name)):
        for sf in part.segments:
            raw = open(sf.path, "rb").read()
            for chunk in sf.chunks():
                t, c = chunk.table, chunk.cols
                starts = np.searchsorted(c.bundle, np.arange(len(t)))
                sizes, varint_counts = t.sizes, t.varint_counts
                for i in range(len(t)):
                    msgs = [
                        Message(int(c.seq[j]), int(c.ts[j]), c.key(j), c.value(j))
                        for j in range(starts[i], starts[i] + t.counts[i])
                    ]
                    sparse = bool(t.flags[i] & 0x40)
                    off = chunk.file_offset + t.offsets[i]
                    orig = raw[off : off + sizes[i]]
                    if t.flags[i] & 3 == 0:
                        enc = frame(encode_bundle(msgs, sparse=sparse, varint_count=varint_counts[i]))
                        assert enc == orig, (sf.path, off)
                    else:
                        _, header_start = decode_varint(raw, off)
                        set_start = chunk.file_offset + t.set_offsets[i]
                        plain = encode_bundle(msgs, sparse=sparse, codec=Codec.NONE, varint_count=varint_counts[i])
                        header = raw[header_start:set_start]
                        assert header == bytes([plain[0] | 1]) + plain[1 : len(header)], (sf.path, off)
                        assert bytes(decompress(raw[set_start : off + sizes[i]])) == encode_message_set(msgs, sparse)
                        snappy_total += 1
                        snappy_same += (
                            frame(encode_bundle(msgs, sparse=sparse, codec=Codec.SNAPPY, varint_count=varint_counts[i]))
                            == orig
                        )
    if snappy_total:
        assert snappy_same > 0  # identical compressor output for part of them (see docstring)
