"""The resynchronisation scan past a break (storage/salvage.py `resync_offset`, docs/FORMAT.md §3.11): its bulk
filter of candidate offsets must give the answer of trying `_chain_at` at every byte, as the scan did before."""

import glob
import os
import random
import time

from conftest import FIXTURES

from tank_log.format.bundle import Codec, encode_bundle, frame
from tank_log.format.messages import Message
from tank_log.storage.salvage import _chain_at, resync_offset
from tank_log.storage.segment import Segment


def exhaustive(buf, next_seq, reaches_eof):
    """The scan before the filter: `_chain_at` at every offset."""
    return next((p for p in range(1, len(buf) - 2) if _chain_at(buf, p, next_seq, reaches_eof=reaches_eof)), None)


def assert_same(buf, next_seq=1):
    for reaches_eof in (True, False):
        want = exhaustive(buf, next_seq, reaches_eof)
        assert resync_offset(buf, next_seq, reaches_eof=reaches_eof) == want, (len(buf), next_seq, reaches_eof)


def _segments():
    paths = sorted(glob.glob(os.path.join(FIXTURES, "**", "*log"), recursive=True))
    return [p for p in paths if p.endswith((".log", ".ilog")) and os.path.getsize(p) > 8]


SEGMENTS = _segments()


def test_fixture_segments_torn_at_many_offsets():
    """Every real segment (plain, Snappy, sparse, compacted) cut in and between bundles, the scan window ending at
    its end or torn short: the bytes after a break in a real file."""
    rng = random.Random(7)
    for path in SEGMENTS:
        data = open(path, "rb").read()
        seg = Segment(path)
        starts = [b.offset for b in seg.bundles()]
        cuts = {rng.randrange(len(data) - 4), min(starts[-1] + rng.randrange(1, 8), len(data) - 4)}
        for k in sorted(cuts):
            stop = rng.choice([len(data), min(len(data), k + rng.randrange(4, 1000))])
            buf = data[k:stop][-1000:]  # the scan window's end: the file's or a torn short one
            assert_same(buf, rng.choice([seg.base, 1, 2**63, 2**64 - 1]))


def test_random_garbage_and_garbage_before_valid_bundles():
    rng = random.Random(11)
    tails = [open(p, "rb").read()[:1000] for p in SEGMENTS[:: max(1, len(SEGMENTS) // 12)]]
    for _ in range(20):
        garbage = rng.randbytes(rng.randrange(1, 1500))
        assert_same(garbage)
        assert_same(garbage + rng.choice(tails), rng.choice([1, 5, 10**6]))
        ascii_garbage = bytes(rng.randrange(0x20, 0x7F) for _ in range(rng.randrange(1, 1000)))  # text payloads
        assert_same(ascii_garbage + rng.choice(tails))


def test_torn_plain_and_snappy_bundles_of_real_messages():
    """A big bundle cut short (what a torn tail is), plain and Snappy, alone and followed by real bundles."""
    values = [(m.key, m.value) for p in SEGMENTS[:6] for m in Segment(p).messages()][:300]
    msgs = [Message(100 + i, 1_700_000_000_000 + i, k, v) for i, (k, v) in enumerate(values)]
    for sparse, codec in ((False, Codec.NONE), (True, Codec.NONE), (False, Codec.SNAPPY), (True, Codec.SNAPPY)):
        codec_bundle = encode_bundle(msgs, sparse=sparse, codec=codec)
        torn = frame(codec_bundle)[:2500]
        assert_same(torn, 100)
        assert_same(torn + open(SEGMENTS[0], "rb").read()[:1500], 100)


def test_a_buffer_every_offset_of_which_passes_the_filter_stays_bounded():
    """Every offset of b"\\x04"*n is a complete one-message plain bundle whose flags the filter accepts: each
    candidate then costs one bundle's walk, not the walk of the whole chain behind it."""
    assert_same(b"\x04" * 2048)
    t = time.perf_counter()
    assert resync_offset(b"\x04" * (32 << 10), 1, reaches_eof=True) is None
    assert time.perf_counter() - t < 20
