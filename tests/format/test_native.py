"""The compiled core (tank_log/format/_codec.pyx, tools/_dump_lines.pyx, maintenance/compaction/_key_map.pyx)
against the pure-Python code: the same columns, bytes and errors on valid, mutated and random input, and the switch
between them."""

import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_bundle import message_runs
from test_robustness import _samples, mutate

from tank_log.errors import TankFormatError
from tank_log.format import _codec, native
from tank_log.format import decode as decode_mod
from tank_log.format.bundle import (
    Codec,
    Message,
    SnappyPolicy,
    encode_bundle,
    encode_message_set,
    encode_message_set_columns,
    frame,
    frame_bundles,
    messages_of,
)
from tank_log.format.decode import collect_bundles, decode_messages, walk_bundles
from tank_log.maintenance.compaction import _key_map


def outcome(buf: bytes, next_seq: int = 1, **kwargs) -> tuple:
    """Everything a walk and decode produce, or the error (message and offset)."""
    try:
        res = walk_bundles(buf, 0, next_seq, **kwargs)
        t = res.table
        out: list = [res.stop, res.next_seq, res.reason, res.need]
        out += [a.tolist() for a in (t.offsets, t.ends, t.set_offsets, t.flags, t.counts, t.firsts, t.lasts)]
        if kwargs.get("collect", True):
            c = decode_messages(t)
            out += [a.tolist() for a in (c.seq, c.ts, c.key_off, c.key_len, c.val_off, c.val_len, c.bundle)]
            out += [t.data, t.set_starts.tolist(), t.set_ends.tolist()]
        return ("ok", out)
    except TankFormatError as err:
        return ("error", err.message, err.offset)


def both(buf: bytes, **kwargs) -> tuple:
    with native.use_pure(False):
        fast = outcome(buf, **kwargs)
    with native.use_pure(True):
        pure = outcome(buf, **kwargs)
    assert fast == pure
    return fast


def test_the_compiled_core_is_built_and_chosen():
    """CI and dev installs have Cython and gcc: a silent fallback to the pure core would hide a broken build."""
    assert native.available()
    if not os.environ.get(native.PURE_ENV):
        assert native.name() == "native"


def test_the_environment_variable_forces_the_pure_core():
    code = "from tank_log.format import native; print(native.name(), native.available())"
    for value, want in [("1", "pure True"), ("0", "native True"), ("", "native True")]:
        env = {**os.environ, native.PURE_ENV: value}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.split() == want.split()


def mutated(seed: int, count: int):
    """(n, rng, base seq, buffer): `count` mutations of the robustness samples, cycling through them."""
    rng = random.Random(seed)
    samples = _samples()
    for n in range(count):
        _, base, data = samples[n % len(samples)]
        yield n, rng, base, mutate(rng, data)


def walked_headers(seed: int, count: int):
    """(rng, buffer, headers-only table) of the mutations (`mutated`) whose bundle headers walk."""
    for _, rng, base, buf in mutated(seed, count):
        try:
            headers = walk_bundles(buf, 0, base, collect=False).table
        except TankFormatError:
            continue
        yield rng, buf, headers


def test_mutated_segments_give_the_same_outcome_on_both_cores():
    seen = {"ok": 0, "error": 0}
    for n, _, base, buf in mutated(4321, 3000):
        kwargs = [{}, {"collect": False}, {"max_messages": 3}, {"stop_seq": base + 5}, {"max_bytes": 200}][n % 5]
        seen[both(buf, next_seq=base, **kwargs)[0]] += 1
    assert seen["ok"] > 300 and seen["error"] > 500, seen


def test_collecting_chosen_bundles_decodes_as_the_collecting_walk(codec_core):
    """Compaction's pass 2 walks headers, then collects some bundles (`collect_bundles`): the same messages, or the
    same error, as collecting each chosen bundle with a walk of its own."""
    seen = {"ok": 0, "error": 0}
    for rng, buf, headers in walked_headers(99, 1500):
        rows = np.array(sorted(rng.sample(range(len(headers)), rng.randrange(len(headers) + 1))), dtype=np.int64)
        try:  # the oracle: each chosen bundle collected by a walk of its own
            one_by_one = []
            for i in rows.tolist():
                first, last = int(headers.firsts[i]), int(headers.lasts[i])
                alone = walk_bundles(buf, int(headers.offsets[i]), first, stop_seq=last).table
                one_by_one += messages_of(decode_messages(alone))
            expected: tuple = ("ok", one_by_one)
        except TankFormatError as err:
            expected = ("error", err.message, err.offset)
        try:
            got: tuple = ("ok", messages_of(decode_messages(collect_bundles(headers, rows))))
        except TankFormatError as err:
            got = ("error", err.message, err.offset)
        assert got == expected
        seen[got[0]] += 1
    assert seen["ok"] > 300 and seen["error"] > 100, seen


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300), st.integers(1, 2**64), st.one_of(st.none(), st.integers(0, 2**64 + 2)))
def test_random_bytes_give_the_same_outcome(buf, next_seq, stop_seq):
    both(buf, next_seq=next_seq, stop_seq=stop_seq)


@settings(max_examples=300, deadline=None)
@given(st.lists(message_runs(max_len=6), min_size=1, max_size=4), st.integers(0, 10**6), st.data())
def test_corrupted_bundles_give_the_same_outcome(groups, seed, data):
    """Valid bundles (plain, Snappy, sparse) with a few bytes changed: both cores agree byte for byte or error for
    error."""
    buf = b""
    for i, g in enumerate(groups):
        buf += frame(encode_bundle(g, sparse=True, codec=data.draw(st.sampled_from([0, 1]), label=f"codec{i}")))
    rng = random.Random(seed)
    b = bytearray(buf)
    for _ in range(rng.randrange(0, 4)):
        b[rng.randrange(len(b))] = rng.randrange(256)
    both(bytes(b))


def test_seqs_up_to_two_to_the_64():
    """The running counter reaches 2**64 after a bundle ending at 2**64-1 (§3.6), and past it is an error."""
    last = 2**64 - 1
    ok = frame(encode_bundle([Message(last - 1, 5, None, b"a"), Message(last, 5, None, b"b")], sparse=True))
    assert both(ok)[1][1] == 2**64
    plain_after = frame(encode_bundle([Message(1, 5, None, b"c")], sparse=False))
    result = both(ok + plain_after)
    assert result[0] == "error" and result[2] == len(ok)


def test_snappy_sets_on_both_sides_of_the_compiled_decoders_limit():
    """Snappy sets of up to 64 KiB are decoded by the walk's own decoder, larger ones by cramjam (_codec.pyx
    SNAPPY_HERE_MAX, 65536 bytes): sets of every size around the limit, valid and damaged, read the same on both
    cores, by the walk and into Arrow batches."""
    rng = random.Random(7)
    for size in range(65510, 65570, 3):
        msgs = [Message(1, 5, b"k", bytes(rng.choice(b"abcd") for _ in range(size - 20)))]
        bundle = frame(encode_bundle(msgs, sparse=False, codec=Codec.SNAPPY))
        assert both(bundle)[0] == "ok"
        assert batch_outcome(bundle)[0] == "ok"
        for _ in range(5):
            damaged = bytearray(bundle)
            damaged[rng.randrange(8, len(damaged))] ^= 1 << rng.randrange(8)
            both(bytes(damaged))
            batch_outcome(bytes(damaged))


def batch_or_error(read, table) -> tuple:
    """("ok", the batch `read` makes of a headers-only walk's table, validated), or ("error", message, offset)."""
    try:
        batch = read(table)
        batch.validate(full=True)
        return ("ok", batch)
    except TankFormatError as err:
        return ("error", err.message, err.offset)


def assert_same_outcome(a: tuple, b: tuple) -> None:
    """Two `batch_or_error` outcomes: equal batches, or the same error at the same offset."""
    assert a[0] == b[0] and (a[1].equals(b[1]) if a[0] == "ok" else a == b)


def batch_outcome(buf: bytes, next_seq: int = 1) -> tuple:
    """The Arrow batch of a headers-only walk's bundles (`walked_batch`), or its error, the same on both cores."""
    from tank_log.format.arrow import walked_batch

    got = []
    for pure in (False, True):
        with native.use_pure(pure):
            got.append(batch_or_error(walked_batch, walk_bundles(buf, 0, next_seq, collect=False).table))
    assert_same_outcome(*got)
    return got[0]


def scanned_once(monkeypatch) -> None:
    """The hole audit's scan past a break (`salvage.data_beyond_break`: a walk at every byte after it, ~0.1 s a
    segment) run once per file content and tail: both reads of a segment audit the same bytes, and where their tails
    agree the second gets what the first scan found; where they differ, each tail is scanned."""
    from tank_log.storage import completeness, salvage

    found: dict = {}

    def data_beyond_break(seg, tail):
        index = Path(seg.index_path).read_bytes() if os.path.exists(seg.index_path) else None
        key = (Path(seg.path).read_bytes(), index, tail)
        if key not in found:
            found[key] = salvage.data_beyond_break(seg, tail)
        return found[key]

    monkeypatch.setattr(completeness, "data_beyond_break", data_beyond_break)


def segment_reads(seg, read, **kwargs) -> tuple:
    """A segment read chunk by chunk (`read`: "chunks" or "batch_chunks"): each chunk's file offset, bundle offsets
    and seqs, then the error (message, file, offset), and what the hole audit makes of the same read."""
    from tank_log.storage.completeness import SegmentAudit, audited

    got: list = []
    try:
        for c in getattr(seg, read)(**kwargs):
            got.append((c.file_offset, c.table.offsets.tolist(), c.seq.tolist()))
    except TankFormatError as err:
        got.append(("error", err.message, err.path, err.offset))
    audit = SegmentAudit(seg)
    walk = getattr(seg, read)(**kwargs)
    try:
        for _ in audited(walk, audit):
            pass
        hole = audit.finish(walk.tail)
    except TankFormatError as err:
        hole = err
    return tuple(got), str(hole)


@pytest.mark.slow
@pytest.mark.parametrize("budget", [None, 5])
def test_segments_read_into_batches_as_into_decoded_chunks(tmp_path, monkeypatch, budget):
    """Mutated segments on disk read with `Segment.batch_chunks` (headers first, then each chunk's sets in one pass)
    and with `Segment.chunks` (decompressing while walking): the same chunks, the same first error in file order
    (a set that does not decompress before a bad header), the same hole; small chunks, and a message budget that
    ends them (DEFAULT_MAX_MESSAGES cut to 5)."""
    from tank_log.storage.segment import Segment

    if budget is not None:
        monkeypatch.setattr(decode_mod, "DEFAULT_MAX_MESSAGES", budget)
    scanned_once(monkeypatch)
    seen = {"ok": 0, "error": 0}
    path = tmp_path / "1.log"
    for n, _, base, buf in mutated(77, 500):
        path.write_bytes(buf)
        seg = Segment(path, base)
        kwargs = {"chunk_bytes": [1 << 20, 300, 64][n % 3]}
        reads = segment_reads(seg, "batch_chunks", **kwargs)
        assert reads == segment_reads(seg, "chunks", **kwargs)
        seen["error" if reads[0] and reads[0][-1][0] == "error" else "ok"] += 1
    assert seen["ok"] > 200 and seen["error"] > 150, seen


def test_a_walked_batch_keeps_no_more_memory_alive_than_it_holds():
    """The one-pass read sizes its key and value buffers for every set's whole length, then cuts them to what they
    hold: keyless messages leave no key buffer behind, and the batch keeps little more than its bytes alive."""
    import tracemalloc

    from tank_log.format.arrow import compiled_walked_batch

    msgs = [Message(s, 5, None, bytes([s % 251]) * 200) for s in range(1, 20_001)]
    buf = b"".join(
        frame(encode_bundle(msgs[i : i + 100], sparse=False, codec=Codec.SNAPPY)) for i in range(0, 20_000, 100)
    )
    table = walk_bundles(buf, 0, 1, collect=False).table
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        batch = compiled_walked_batch(table)
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert batch.column("key").null_count == 20_000 and batch.column("key").buffers()[2].size == 0
    assert batch.nbytes <= kept < 1.1 * batch.nbytes, (kept, batch.nbytes)


def test_walked_batches_of_mutated_segments_are_the_decoded_columns_batches():
    """The compiled one-pass read into Arrow (`_codec.scan_sets`) against the columns the pure core decodes: the
    same batch, or the same error at the same offset, on 1,500 mutated segments whose headers walk."""
    from tank_log.format.arrow import columns_batch, compiled_walked_batch
    from tank_log.format.decode import NATIVE_CODECS as CODECS

    def pure_columns_batch(table):
        with native.use_pure(True):
            return columns_batch(table)

    seen = {"ok": 0, "error": 0}
    for _, _, headers in walked_headers(2024, 1500):
        fast = batch_or_error(compiled_walked_batch, headers)
        assert_same_outcome(fast, batch_or_error(pure_columns_batch, headers))
        t = headers
        one_pass = _codec.scan_sets(t.walked, t.set_offsets, t.ends, t.flags, t.counts, t.firsts, t.lasts, CODECS)
        assert (one_pass is not None) == (fast[0] == "ok")  # the batch came from the one pass, not the columns
        seen[fast[0]] += 1
    assert seen["ok"] > 300 and seen["error"] > 100, seen


@settings(max_examples=300, deadline=None)
@given(message_runs(), st.booleans())
def test_encoding_is_identical(msgs, sparse):
    if not sparse:
        msgs = [Message(msgs[0].seq + i, m.ts, m.key, m.value) for i, m in enumerate(msgs)]
    with native.use_pure(False):
        fast = encode_message_set(msgs, sparse)
    with native.use_pure(True):
        pure = encode_message_set(msgs, sparse)
    assert fast == pure


@settings(max_examples=300, deadline=None)
@given(message_runs(), st.booleans())
def test_encoding_from_columns_is_identical(msgs, sparse):
    """The writer's bulk path: encode_message_set_columns over decoded columns = encode_message_set of the tuples."""
    if not sparse:
        msgs = [Message(msgs[0].seq + i, m.ts, m.key, m.value) for i, m in enumerate(msgs)]
    cols = decode_messages(walk_bundles(frame(encode_bundle(msgs, sparse=True)), 0, 1).table)
    expected = encode_message_set([m if m.key else m._replace(key=None) for m in msgs], sparse)
    for pure in (False, True):
        with native.use_pure(pure):
            assert encode_message_set_columns(cols, sparse) == expected


def test_encoding_from_columns_outside_the_buffer_is_left_to_the_pure_encoder():
    cols = decode_messages(walk_bundles(frame(encode_bundle([Message(1, 0, b"k", b"v")], sparse=False)), 0, 1).table)
    assert native.compiled()
    from tank_log.format import _codec as core

    for field, value in (("key_off", len(cols.data)), ("val_len", len(cols.data) + 1), ("key_len", 256)):
        bad = cols.slice(0, 1)
        setattr(bad, field, getattr(bad, field) + value)
        args = (bad.data, bad.seq, bad.ts, bad.key_off, bad.key_len, bad.val_off, bad.val_len, False)
        assert core.encode_columns(*args) is None


def test_encoding_rejects_what_the_pure_encoder_rejects():
    bad = [
        [Message(1, 0, b"k" * 256, b"v")],  # key over 255 bytes
        [Message(5, 0, None, b"a"), Message(4, 0, None, b"b"), Message(9, 0, None, b"c")],  # seqs going back
        [Message(1, 0, None, b"a"), Message(2**33, 0, None, b"b"), Message(2**34, 0, None, b"c")],  # gap >= 2**32
        [Message(1, -1, None, b"a")],  # ts outside u64
    ]
    for msgs in bad:
        errors = []
        for pure in (False, True):
            with native.use_pure(pure):
                try:
                    encode_message_set(msgs, True)
                except Exception as err:
                    errors.append((type(err), str(err)))
        assert len(errors) == 2 and errors[0] == errors[1], errors


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.binary(min_size=1, max_size=20), st.text(alphabet='ab"\\ \x7e', max_size=9)),
            st.one_of(
                st.binary(max_size=40),
                st.text(alphabet='xy"\\/ \x7f', max_size=12),
                # long printable text with a rare special byte: the 8-byte words of the compiled core's fast path
                st.text(alphabet="abc{}:, " * 8 + '"\\\x1f\x7f\x80\t', min_size=8, max_size=60).map(
                    lambda t: t.encode("latin-1")
                ),
            ),
            st.integers(0, 2**64 - 1),
        ),
        min_size=1,
        max_size=20,
    ),
    st.one_of(st.none(), st.text(max_size=5)),
)
def test_dump_lines_are_identical(rows, topic):
    """`tank-log dump`'s bulk JSON lines: the same text on both cores, and the text json.dumps gives."""
    import base64
    import json

    from tank_log.tools.dump import json_lines

    msgs = [
        Message(i + 1, ts, k.encode() if isinstance(k, str) else k, v.encode() if isinstance(v, str) else v)
        for i, (k, v, ts) in enumerate(rows)
    ]
    cols = decode_messages(walk_bundles(frame(encode_bundle(msgs, sparse=False)), 0, 1).table)
    prefix = json.dumps({"topic": topic, "partition": 3}, separators=(",", ":"))[:-1] + ',"seq":'
    texts = []
    for pure in (False, True):
        with native.use_pure(pure):
            texts.append(bytes(json_lines(prefix, cols)))
    assert texts[0] == texts[1]

    def text(raw):
        return raw.decode() if all(0x20 <= b < 0x7F for b in raw) else None

    expected = ""
    for m in msgs:
        key = m.key or b""
        rec = {"topic": topic, "partition": 3, "seq": m.seq, "ts": m.ts, "key": text(key)}
        rec |= {"key_b64": base64.b64encode(key).decode(), "value": text(m.value)}
        rec["value_b64"] = base64.b64encode(m.value).decode()
        expected += json.dumps(rec, separators=(",", ":")) + "\n"
    assert texts[0] == expected.encode()


def _near_keys(draw_base: bytes, rng: random.Random, n: int) -> list[bytes]:
    """Keys that differ from `draw_base` in one byte, in length, or not at all: the probes a hash or a key compare
    that reads the wrong bytes would confuse."""
    keys = [draw_base]
    for _ in range(n):
        k = bytearray(rng.choice(keys))
        op = rng.randrange(4)
        if op == 0 and k:
            k[rng.randrange(len(k))] ^= 1 << rng.randrange(8)
        elif op == 1 and len(k) < 255:
            k.append(rng.randrange(256))
        elif op == 2 and k:
            k.pop()
        keys.append(bytes(k))
    return keys


def _keys_at_odd_offsets(keys, rng):
    """A buffer holding the keys at odd offsets, after junk (reads must stay within each key), and their columns."""
    data = bytearray(b"\xaa" * 3)
    key_off, key_len = [], []
    for k in keys:
        key_off.append(-1 if k is None else len(data))
        key_len.append(0 if k is None else len(k))
        data += (k or b"") + bytes([rng.randrange(256)])
    return bytes(data), np.array(key_off, np.int64), np.array(key_len, np.int64)


def _records_as_dict(records):
    from tank_log.maintenance.compaction.key_state import unpack_records

    out = {}
    for block in records:
        key_off, key_len, ords, end = unpack_records(block)
        assert end == len(block)
        for off, n, o in zip(key_off.tolist(), key_len.tolist(), ords.tolist(), strict=True):
            assert bytes(block[off : off + n]) not in out
            out[bytes(block[off : off + n])] = o
    return out


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=40), st.integers(0, 10**6), st.integers(1, 300), st.sampled_from([600, 4096, 10**4, 10**6]))
def test_the_compiled_key_map_agrees_with_the_pure_one(base, seed, count, budget):
    """Compaction's key map: the same messages taken, each key's latest ordinal, the same bits marked and the same
    key records given back, for keys of every length 0..255 (each branch of the word-wise hash and compare), keys
    one byte apart, and budgets that fill (growth of the slots and the arena within the budget)."""
    from tank_log.maintenance.compaction.key_state import PureKeyMap

    rng = random.Random(seed)
    pool = _near_keys(base, rng, 30) + [
        bytes(rng.randrange(256) for _ in range(rng.choice([255, 16, 9, 8, 7]))) for _ in range(5)
    ]
    keys = [None if rng.random() < 0.1 else rng.choice(pool) for _ in range(count)]
    args = _keys_at_odd_offsets(keys, rng)
    ords = np.arange(count, dtype=np.uint64) * 3 + 7
    compiled, pure = _key_map.KeyMap(budget), PureKeyMap(budget * 30)  # the pure map charges more per key
    taken = compiled.add(*args, ords)
    assert compiled.nbytes <= budget
    assert pure.add(*(a[:taken] if i else a for i, a in enumerate(args)), ords[:taken]) == taken
    assert len(compiled) == len(pure)
    want = {}
    for k, o in zip(keys[:taken], ords[:taken].tolist(), strict=True):
        if k is not None:
            want[k] = o
    assert _records_as_dict(compiled.records()) == _records_as_dict(pure.records()) == want
    compiled_bits, pure_bits = np.zeros(count, np.uint8), np.zeros(count, np.uint8)
    compiled.mark(compiled_bits)
    pure.mark(pure_bits)
    assert compiled_bits.tolist() == pure_bits.tolist()
    assert int(np.unpackbits(compiled_bits).sum()) == len(want)
    if budget == 10**6:
        assert taken == count


def test_keys_added_straight_from_the_walked_sets_as_from_decoded_columns():
    """Compaction's first pass adds keys straight from each message set (`add_walked`) instead of from a decoded
    chunk's columns: on valid and mutated segments, the same messages taken (up to the first bundle that does not
    decode), the same latest ordinal per key and the same keyless messages and tombstones marked."""
    from tank_log.maintenance.compaction.key_state import add_walked

    seen = {"all": 0, "stopped": 0}
    for _, _, headers in walked_headers(2024, 1500):
        decoded = []  # the oracle: each bundle decoded on its own, up to the first that does not decode
        for i in range(len(headers)):
            try:
                decoded.append(decode_messages(collect_bundles(headers, np.array([i], np.int64))))
            except TankFormatError:
                break
        total = int(headers.counts.sum())
        fast, oracle = _key_map.KeyMap(1 << 24), _key_map.KeyMap(1 << 24)
        marked = np.zeros(total, dtype=bool)
        taken = add_walked(fast, headers, 1000, marked)
        want_marked, ordinal = [], 1000
        for c in decoded:
            ords = np.arange(ordinal, ordinal + len(c), dtype=np.uint64)
            assert oracle.add(c.data, c.key_off, c.key_len, ords) == len(c)
            want_marked += ((c.key_off < 0) | (c.val_len == 0)).tolist()
            ordinal += len(c)
        assert taken == ordinal - 1000
        assert marked[:taken].tolist() == want_marked
        assert _records_as_dict(fast.records()) == _records_as_dict(oracle.records())
        seen["all" if taken == total else "stopped"] += 1
    assert seen["all"] > 200 and seen["stopped"] > 100, seen


def test_keys_added_straight_from_the_walked_sets_stop_where_the_map_is_full():
    """A full map stops `add_walked` at the first new key that does not fit, as `add` stops."""
    from tank_log.maintenance.compaction.key_state import add_walked

    msgs = [Message(i + 1, 5, b"key-%05d" % i, b"v" * 40) for i in range(3000)]
    sets = [msgs[i : i + 100] for i in range(0, 3000, 100)]
    buf = b"".join(frame(encode_bundle(s, sparse=False, codec=Codec.SNAPPY)) for s in sets)
    headers = walk_bundles(buf, 0, 1, collect=False).table
    c = decode_messages(collect_bundles(headers, np.arange(len(headers))))
    fast, oracle = _key_map.KeyMap(40_000), _key_map.KeyMap(40_000)
    ords = np.arange(len(c), dtype=np.uint64)
    want = oracle.add(c.data, c.key_off, c.key_len, ords)
    assert 0 < want < len(c)
    assert add_walked(fast, headers, 0, np.zeros(len(c), dtype=bool)) == want
    assert _records_as_dict(fast.records()) == _records_as_dict(oracle.records())


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 400))
def test_key_records_pack_and_unpack_alike_on_both_cores(seed, count):
    """The spill's key records (u8 length, 5-byte ordinal, key): packed and unpacked to the same bytes and columns
    by both cores; a record cut at the end of a buffer is left for the next read."""
    from tank_log.maintenance.compaction import key_state

    rng = random.Random(seed)
    keys = [
        None if rng.random() < 0.1 else bytes(rng.randrange(256) for _ in range(rng.randrange(256)))
        for _ in range(count)
    ]
    data, key_off, key_len = _keys_at_odd_offsets(keys, rng)
    ords = np.array([rng.randrange(1 << 40) for _ in range(count)], np.uint64)
    rows = np.flatnonzero(key_off >= 0)
    rng.shuffle(rows)
    packed = key_state.pack_records(data, key_off, key_len, ords, rows)
    with native.use_pure():
        assert key_state.pack_records(data, key_off, key_len, ords, rows) == packed
        assert key_state.key_hashes(data, key_off, key_len)[key_off < 0].tolist() == [0] * int((key_off < 0).sum())
    cut = rng.randrange(len(packed) + 1)
    for pure in (False, True):
        with native.use_pure(pure):
            off, n, o, end = key_state.unpack_records(packed[:cut])
        assert end <= cut and (cut == len(packed)) == (end == len(packed))
        assert [packed[a : a + b] for a, b in zip(off.tolist(), n.tolist(), strict=True)] == [
            keys[r] for r in rows[: len(off)]
        ]
        assert o.tolist() == ords[rows[: len(off)]].tolist()


def test_the_compiled_key_map_refuses_keys_outside_the_data():
    """The map hashes keys ahead of the message it stores (to prefetch their slots): a key outside the data is still
    refused, whether it is the first row or one the look-ahead reaches first."""
    data = b"k1k2k3k4k5k6k7k8k9kA"
    for bad_row in (0, 5, 11):
        key_off = np.arange(0, 24, 2, dtype=np.int64)[:12]
        key_off[bad_row] = len(data) - 1  # 2 bytes from the last byte: one past the end
        key_len = np.full(12, 2, np.int64)
        ords = np.arange(12, dtype=np.uint64)
        m = _key_map.KeyMap(1 << 20)
        m.add(data, np.array([0], np.int64), np.array([2], np.int64), np.array([0], np.uint64))
        with pytest.raises(ValueError, match="key outside the data"):
            m.add(data, key_off, key_len, ords)


@st.composite
def bundle_runs(draw):
    """Messages (seqs with gaps or not), cut into bundles, and the counter's next seq before them (None: none)."""
    msgs = draw(message_runs())
    if draw(st.booleans()):  # consecutive seqs: non-sparse bundles where the counter continues
        msgs = [Message(msgs[0].seq + i, m.ts, m.key, m.value) for i, m in enumerate(msgs)]
    cuts = sorted(set(draw(st.lists(st.integers(1, len(msgs) - 1), max_size=6)))) if len(msgs) > 1 else []
    expected = draw(st.sampled_from([None, msgs[0].seq, msgs[0].seq - 1]))
    return msgs, [0, *cuts, len(msgs)], expected or None


@settings(max_examples=300, deadline=None)
@given(bundle_runs(), st.sampled_from(list(SnappyPolicy)))
def test_framing_bundles_in_bulk_is_identical(run, policy):
    """The writer's bulk path (frame_bundles: one call for many bundles on the compiled core) = each bundle framed
    on its own by the pure encoder, sparse exactly where the counter does not continue (§3.6)."""
    msgs, bounds, expected = run
    cols = decode_messages(walk_bundles(frame(encode_bundle(msgs, sparse=True)), 0, 1).table)
    b = np.array(bounds, np.int64)
    with native.use_pure(False):
        fast, fast_ends = frame_bundles(cols, b, expected, policy)
    with native.use_pure(True):
        pure, pure_ends = frame_bundles(cols, b, expected, policy)
    assert fast == pure and fast_ends.tolist() == pure_ends.tolist() == np.cumsum(_framed_sizes(pure)).tolist()
    decoded = messages_of(decode_messages(walk_bundles(fast, 0, expected or msgs[0].seq).table))
    assert decoded == [m if m.key else m._replace(key=None) for m in msgs]


def _framed_sizes(buf: bytes) -> list[int]:
    t = walk_bundles(buf, 0, 1, collect=False).table
    return t.sizes


@settings(max_examples=200, deadline=None)
@given(st.lists(message_runs(max_len=30), min_size=1, max_size=4), st.lists(st.booleans()), st.data())
def test_arrow_batches_are_identical_on_both_cores(groups, codecs, data):
    """to_record_batch: the compiled core gathers keys and values into buffers of the exact size, the pure one has
    Arrow `take` them; the same arrays (null keys, plain and Snappy sets out of buffer order, a row mask). The batch
    read from the walked sets in one pass (`walked_batch`) is the same again."""
    from tank_log.format.arrow import to_record_batch

    buf, seq = b"", 1
    for i, msgs in enumerate(groups):
        msgs = [m._replace(seq=seq + j) for j, m in enumerate(msgs)]
        codec = Codec.SNAPPY if (codecs[i] if i < len(codecs) else False) else Codec.NONE
        buf += frame(encode_bundle(msgs, sparse=True, codec=codec))
        seq += len(msgs)
    cols = decode_messages(walk_bundles(buf, 0, 1).table)
    select = np.array(data.draw(st.lists(st.booleans(), min_size=len(cols), max_size=len(cols))), dtype=bool)
    for mask in (None, select):
        batches = []
        for pure in (False, True):
            with native.use_pure(pure):
                batch = to_record_batch(cols, mask)
            batch.validate(full=True)
            batches.append(batch)
        assert batches[0].equals(batches[1])
        assert batches[0].column("key").null_count == int(((cols.key_off < 0) & (True if mask is None else mask)).sum())
    assert batch_outcome(buf)[1].equals(to_record_batch(cols))


def _snappy_outcome(block: bytes, size: int) -> tuple[bool, bytes]:
    """cramjam's verdict on a raw Snappy block decoded into `size` bytes, and the compiled walk's."""
    import cramjam

    out = bytearray(size)
    try:
        ok = cramjam.snappy.decompress_raw_into(block, out) == size  # the walk: anything else is an error
    except Exception:
        ok = False
    theirs = (ok, bytes(out) if ok else b"")
    mine = bytearray(size)
    from tank_log.format import _codec

    ok = _codec.snappy_raw_into(block, mine)
    return theirs, (ok, bytes(mine) if ok else b"")


def _claim(block: bytes) -> int | None:
    from tank_log.format.varint import decode_varint

    try:
        return decode_varint(block, 0)[0]
    except TankFormatError:
        return None


texts = st.one_of(
    st.binary(max_size=3000),
    st.lists(st.sampled_from([b"a", b"ab", b"key-", b"value=12345;", bytes(range(40)), b"\0" * 70]), max_size=300).map(
        b"".join
    ),
)


@given(texts)
def test_the_compiled_snappy_decoder_reads_what_snappy_wrote(data):
    """The walk's own Snappy decoder (`tl_snappy_raw`) against python-snappy's compressor: every literal length
    form, copies of every offset size, overlapping runs."""
    from tank_log.format.codecs.snappy import compress

    block = compress(data)
    assert _snappy_outcome(block, len(data)) == ((True, data), (True, data))


@given(texts, st.integers(0, 10**6), st.integers(-3, 3))
def test_the_compiled_snappy_decoder_accepts_and_rejects_what_cramjam_does(data, seed, size_change):
    """Mutated blocks (bytes replaced, cut, grown) and wrong output sizes: the compiled decoder agrees with cramjam,
    the decoder of the pure walk, on every block, and writes the same bytes when both accept."""
    from tank_log.format.codecs.snappy import MAX_EXPANSION, compress

    rng = random.Random(seed)
    block = bytearray(compress(data))
    for _ in range(rng.randint(0, 3)):
        what = rng.random()
        if what < 0.6 and block:
            block[rng.randrange(len(block))] = rng.randrange(256)
        elif what < 0.8:
            del block[rng.randrange(len(block) + 1) :]
        else:
            block += bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    claim = _claim(bytes(block))
    if claim is None or claim > MAX_EXPANSION * len(block) + 64:  # the walk refuses these before decoding
        return
    theirs, mine = _snappy_outcome(bytes(block), max(0, claim + size_change))
    assert mine == theirs


def test_the_command_line_and_the_jobs_run_the_compiled_core():
    """Whichever module is imported first, the compiled core is found (a half-initialised package at the decision
    would silently fall back to the pure-Python code: same output, several times slower)."""
    for first in ("tank_log.tools.cli", "tank_log.maintenance.compaction", "tank_log.tools.dump", "tank_spark.compact"):
        code = f"import {first}; from tank_log.format import native; print(native.name())"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        assert out.strip() == "native", first


def test_the_compiled_key_map_refuses_inconsistent_columns_and_a_spent_budget():
    """Columns no walk gives (a bundle without messages, counts past `marked`, counts that overflow, ordinals past
    2**64, a short codec table) are refused before anything is read; a map whose budget is already spent takes no
    key and allocates nothing."""
    buf = b"".join(frame(encode_bundle([Message(s, 5, b"k%d" % s, b"v")], sparse=False)) for s in range(1, 4))
    t = walk_bundles(buf, 0, 1, collect=False).table
    cols = (t.set_offsets, t.ends, t.flags, t.firsts, t.lasts)
    codecs = decode_mod.NATIVE_CODECS

    def call(counts, first=0, marked=3, codec_table=codecs):
        m = _key_map.KeyMap(1 << 20)
        so, en, fl, fi, la = cols
        counts = np.array(counts, np.int64)
        return m.add_sets(buf, so, en, fl, counts, fi, la, first, codec_table, np.zeros(marked, np.uint8))

    assert call([1, 1, 1]) == 3
    for counts, first, marked, codec_table in [
        ([1, -1, 1], 0, 3, codecs),
        ([1, 0, 1], 0, 3, codecs),
        ([1, 1, 2], 0, 3, codecs),
        ([2**62, 2**62, 2**62], 0, 3, codecs),
        ([1, 1, 1], 2**64 - 2, 3, codecs),
        ([1, 1, 1], 0, 3, ()),
    ]:
        with pytest.raises(ValueError):
            call(counts, first, marked, codec_table)
    spent = _key_map.KeyMap(-463_203)
    key_off, key_len = np.array([0], np.int64), np.array([2], np.int64)
    assert spent.add(b"k1", key_off, key_len, np.array([0], np.uint64)) == 0
    assert spent.nbytes == 0


def test_the_compiled_decode_refuses_counts_no_walk_gives():
    """Negative counts, counts that overflow when summed, and a bundle without messages but with bytes: None (the
    pure decoder then names the error), never a write past the columns."""
    data = b"\0" * 600
    for counts in ([1, 2**63 - 1, -(2**63) + 2], [-1], [0]):
        n = len(counts)
        got = _codec.decode(
            data,
            np.zeros(n, np.int64),
            np.full(n, 10, np.int64),
            np.array(counts, np.int64),
            np.zeros(n, np.uint8),
            np.ones(n, np.uint64),
            np.ones(n, np.uint64),
        )
        assert got is None, counts
