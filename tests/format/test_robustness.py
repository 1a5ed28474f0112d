"""Thousands of mutated fixture segments raise only TankFormatError (or are reported by verify), with work bounded by
their size."""

import json
import os
import random
import sys

import pytest
from conftest import data_dir

from tank_log.errors import TankFormatError
from tank_log.format.bundle import Codec, Message, encode_bundle, frame
from tank_log.maintenance.verify import check_segment
from tank_log.storage.datadir import partitions_at
from tank_log.storage.segment import Segment


def _samples():
    """Small prefixes (a few bundles) of varied fixture segments: plain, Snappy, sparse, varint counts."""
    out = []
    for name, topic in [
        ("A_multi", "events"),
        ("A_multi", "seqgap"),
        ("B2_compaction_live", "kvlive"),
        ("B_after", "kv"),
        ("C_misc", "bigmsg"),
        ("E_after", "kv"),
    ]:
        for part in partitions_at(data_dir(name)):
            if part.topic != topic:
                continue
            for sf in part.segments[:2]:
                raw = open(sf.path, "rb").read()
                headers = list(sf.bundles())
                end = headers[min(len(headers) - 1, 6)].end
                out.append((os.path.basename(sf.path), sf.base, raw[: min(end, 60000)]))
    return out


WORK_PER_BYTE = 250  # Python and C calls per input byte (plus a fixed 20,000): the worst of these inputs takes
# ~8.6 (compiled core) and ~24 (pure-Python core) in `check_segment`; work that grows faster than the input does not fit


class Hang(BaseException):  # not an Exception: no `except Exception` of the code under test can swallow it
    pass


def bounded_by_size(size: int, fn, *args):  # type: ignore[no-untyped-def]
    """`fn(*args)`, failing with Hang once it has made more calls than an input of `size` bytes warrants. The work is
    counted (the profiler's call events), not timed: the machine's speed and load decide nothing."""
    budget, calls = WORK_PER_BYTE * (size + 20_000), 0

    def count(frame, event, arg):  # type: ignore[no-untyped-def]
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1
            if calls > budget:
                sys.setprofile(None)
                raise Hang(f"{fn.__name__} made more than {budget} calls on {size} bytes")

    sys.setprofile(count)
    try:
        return fn(*args)
    finally:
        sys.setprofile(None)


def _walk(path: str, base: int) -> bool:
    """Walk every batch of the segment; whether it ends torn."""
    walk = Segment(path, base).batches()
    for _ in walk:
        pass
    return bool(walk.tail.torn_bytes)


def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    kind = rng.randrange(6)
    if kind == 0:  # truncation
        return bytes(b[: rng.randrange(len(b))])
    if kind == 1:  # bit flips
        for _ in range(rng.randrange(1, 4)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
    elif kind == 2:  # random byte
        b[rng.randrange(len(b))] = rng.randrange(256)
    elif kind == 3:  # bad varint run
        i = rng.randrange(len(b))
        b[i : i + 6] = b"\xff" * 6
    elif kind == 4:  # wrong count in the first bundle's flags
        i = 1 if b[0] < 0x80 else 2
        b[i] = (b[i] & 0xC3) | (rng.randrange(16) << 2)
    else:  # garbage in the middle
        i = rng.randrange(len(b))
        b[i : i + 8] = rng.randbytes(8)  # from the seeded rng: a failure reproduces
    return bytes(b)


def test_mutations_raise_only_format_errors(tmp_path):
    rng = random.Random(1234)
    samples = _samples()
    outcomes = {"ok": 0, "error": 0, "torn": 0}
    for n in range(3000):
        name, base, data = samples[n % len(samples)]
        path = tmp_path / name
        mutated = mutate(rng, data)
        path.write_bytes(mutated)
        try:
            outcomes["torn" if bounded_by_size(len(mutated), _walk, str(path), base) else "ok"] += 1
        except TankFormatError as err:
            assert err.path == str(path) and err.offset is not None
            outcomes["error"] += 1
        if n % 10 == 0:
            bounded_by_size(len(mutated), check_segment, str(path))  # verify never raises
    assert outcomes["error"] > 500 and outcomes["ok"] > 100, outcomes


def test_bad_snappy_length_claim_does_not_allocate(tmp_path):
    good = frame(encode_bundle([Message(1, 0, None, b"q" * 5000)], sparse=False, codec=Codec.SNAPPY))
    b = bytearray(good)
    b[3:8] = b"\xff\xff\xff\xff\x0f"  # uncompressed length claims 4 GiB
    path = tmp_path / "1_1.log"
    path.write_bytes(bytes(b))
    with pytest.raises(TankFormatError, match="Snappy"):
        list(Segment(str(path)).messages())


def _hostile_segment(path, megabytes, counts):
    """Real Snappy bundles whose counts are raised (`counts(message set, compressed set)`): a crafted input."""
    from tank_log.format.bundle import Message, encode_message_set, frame
    from tank_log.format.codecs import Codec, block_codec
    from tank_log.format.varint import encode_varint

    data, seq = bytearray(), 1
    while len(data) < megabytes << 20:
        msgs = [Message(seq + i, 1_700_000_000_000, None, b"\0" * 2000) for i in range(40)]
        plain = encode_message_set(msgs, False)
        packed = block_codec(Codec.SNAPPY).compress(plain)
        count = counts(plain, packed)
        data += frame(bytes([int(Codec.SNAPPY)]) + encode_varint(count) + packed)
        seq += count
    open(path, "wb").write(data)


@pytest.mark.parametrize(
    "counts",
    [lambda plain, packed: 22 * len(packed) + 64, lambda plain, packed: len(plain) // 2],
    ids=["decoder-maximum", "what-the-set-could-hold"],
)
def test_memory_stays_bounded_on_hostile_counts(tmp_path, counts):
    """4 MB of bundles claiming far more messages than they hold: a typed error naming the file and offset,
    with peak memory bounded (it was about 1.1 GB per MB of input before the count checks and the decode budget)."""
    import subprocess
    import sys

    pdir = tmp_path / "t" / "0"
    pdir.mkdir(parents=True)
    path = str(pdir / "1_1700000000.log")
    _hostile_segment(path, 4, counts)
    probe = (
        "import json, sys\n"
        "from tank_log.maintenance.verify import verify_path\n"
        "problems = [str(p) for p in verify_path(sys.argv[1])]\n"
        # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so it would report the forking pytest's size
        "hwm = [int(x.split()[1]) for x in open('/proc/self/status') if x.startswith('VmHWM:')][0]\n"
        "print(json.dumps([problems, hwm]))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe, str(pdir)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    problems, maxrss_kb = json.loads(out.stdout)
    assert any(f"{path} @0: [format] message count" in p for p in problems), problems
    assert maxrss_kb < 400 * 1024, f"peak RSS {maxrss_kb // 1024} MiB"
