"""`spark.readStream.format("tank")` — appends, rolls, new partitions and topics, compacted data, and data
deleted by retention before it was read (TANK_FORMAT.md §2.4–§2.5, §5, §9 rule 2)."""

import ast
import os

import pytest
from conftest import copy_tree, data_dir, load_dump

from tank_log.format.bundle import Message
from tank_log.storage.appender import PartitionAppender
from tank_log.storage.datadir import scan_partition
from tank_spark.stream import read_data_loss_log


def msgs(lo, hi):
    return [Message(s, 1_800_000_000_000 + s, b"k%d" % (s % 5), b"value %d" % s) for s in range(lo, hi + 1)]


def feed(app: PartitionAppender, lo: int, hi: int, per_bundle: int = 10) -> None:
    for first in range(lo, hi + 1, per_bundle):
        app.append(msgs(first, min(hi, first + per_bundle - 1)))


class Stream:
    """A stream advanced by hand: each step is one `availableNow` query on the same checkpoint, which reads what is
    there when the step starts and stops. Between steps nothing reads (a query left running on the default trigger
    could read data a test deletes before its next step, depending on the machine's speed)."""

    def __init__(self, spark, base, checkpoint, **options):
        self.spark, self.base, self.checkpoint, self.options = spark, base, checkpoint, options
        self.rows: list = []

    def step(self):
        reader = self.spark.readStream.format("tank")
        for k, v in self.options.items():
            reader = reader.option(k, str(v))
        query = (
            reader.load(self.base)
            .writeStream.foreachBatch(self._collect)  # the memory sink cannot restart from a checkpoint
            .option("checkpointLocation", self.checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        self.query = query  # its lastProgress: where the step ended
        query.awaitTermination()  # raises what the step raised
        return self

    def _collect(self, batch, batch_id):
        self.rows += batch.collect()

    def seqs(self):
        out: dict = {}
        for r in self.rows:
            out.setdefault((r.topic, r.partition), []).append(r.seq)
        return {k: sorted(v) for k, v in out.items()}

    def stop(self):
        pass  # every step's query has stopped


def test_appends_rolls_and_new_partitions_and_topics(spark, tmp_path):
    base = str(tmp_path / "base")
    t0 = PartitionAppender(os.path.join(base, "t", "0"), segment_bytes=400)
    feed(t0, 1, 50)
    s = Stream(spark, base, str(tmp_path / "ck")).step()
    assert s.seqs() == {("t", 0): list(range(1, 51))}
    feed(t0, 51, 300)  # several rolls
    t1 = PartitionAppender(os.path.join(base, "t", "1"))
    feed(t1, 1, 7)
    feed(PartitionAppender(os.path.join(base, "u", "0")), 1, 3)
    with open(t0._active, "ab") as fh:  # noqa: SLF001 — an append in flight: waits for the next trigger
        fh.write(b"\x90\x01\x00")
    s.step()
    assert t0.rolls >= 3
    assert s.seqs() == {("t", 0): list(range(1, 301)), ("t", 1): list(range(1, 8)), ("u", 0): list(range(1, 4))}
    progress = s.query.lastProgress["sources"][0]
    # pyspark 4.1 renders a source's offset in the progress as a Python dict's repr, 4.2 as its JSON: both literals
    assert ast.literal_eval(progress["endOffset"]) == {"t/0": 301, "t/1": 8, "u/0": 4}
    s.stop()


def test_compacted_data_streams_as_its_dump(spark, tmp_path):
    base = copy_tree(data_dir("E_after"), str(tmp_path / "e"))
    s = Stream(spark, base, str(tmp_path / "ck")).step()
    want = {k: [m[0] for m in v] for k, v in load_dump("E_after").items() if v}
    assert s.seqs() == want and any(b - a > 1 for v in want.values() for a, b in zip(v, v[1:], strict=False))
    s.stop()


def test_data_deleted_before_it_was_read(spark, tmp_path):
    base = str(tmp_path / "base")
    path = os.path.join(base, "t", "0")
    app = PartitionAppender(path, segment_bytes=300)
    feed(app, 1, 40)
    loss_log = str(tmp_path / "loss.jsonl")
    s = Stream(spark, base, str(tmp_path / "ck"), failOnDataLoss="false", dataLossLog=loss_log).step()
    feed(app, 41, 200)
    doomed = [sf for sf in scan_partition(path, "t", 0).ro if sf.base > 40][:3]  # unread segments
    front = [sf for sf in scan_partition(path, "t", 0).ro if sf.base <= doomed[-1].base]
    for sf in front:  # retention deletes from the front (§5): the read segments before them go too
        os.unlink(sf.path)
        os.unlink(sf.index_path)
    s.step()
    lost_to = doomed[-1].last
    assert s.seqs() == {("t", 0): list(range(1, 41)) + list(range(lost_to + 1, 201))}
    (entry,) = read_data_loss_log(loss_log)
    assert (entry["topic"], entry["partition"], entry["from_seq"], entry["to_seq"]) == ("t", 0, 41, lost_to)
    s.stop()

    strict = Stream(spark, base, str(tmp_path / "ck2"), startingOffsets='{"t/0": 41}')
    with pytest.raises(Exception, match="deleted before they were read"):
        strict.step()


def test_a_hole_fails_the_stream_or_is_logged(spark, tmp_path):
    """An RO segment truncated in the middle (its name says 4682, the content ends at 4382): the stream returned the
    short read silently. It now fails naming the file, offset and seqs, or with failOnDataLoss=false logs them."""
    base = copy_tree(os.path.join(data_dir("A_multi"), "events"), str(tmp_path / "base" / "t"))
    for p in ("0", "2"):
        os.rename(os.path.join(base, p), str(tmp_path / f"unused-{p}"))  # events/1 alone, as t/0
    os.rename(os.path.join(base, "1"), os.path.join(base, "0"))
    segment = os.path.join(base, "0", "2829-4682_1795261032.ilog")
    os.truncate(segment, 30000)
    base = str(tmp_path / "base")
    strict = Stream(spark, base, str(tmp_path / "ck"))
    with pytest.raises(Exception, match=r"could not be read \(a hole\): .*@27826: seqs 4383\.\.4682 not read"):
        strict.step()
    loss_log = str(tmp_path / "loss.jsonl")
    s = Stream(spark, base, str(tmp_path / "ck2"), failOnDataLoss="false", dataLossLog=loss_log).step()
    want = [seq for seq, _, _, _ in load_dump("A_multi")[("events", 1)] if not 4383 <= seq <= 4682]
    assert s.seqs() == {("t", 0): want}
    (entry,) = read_data_loss_log(loss_log)
    assert (entry["topic"], entry["partition"], entry["from_seq"], entry["to_seq"]) == ("t", 0, 4383, 4682)
    assert entry["hole"].startswith(f"{segment} @27826: seqs 4383..4682 not read")
    s.stop()


def _damaged_partition(tmp_path, pid, kind):
    """events/`pid` of A_multi as t/0 with its first RO segment damaged: a bundle in the middle duplicated (`dup`:
    every message after it renumbered), or zeros from the middle of that bundle to the end of the file (`zeros`: a
    crash that extended the file without writing it; that bundle's message decodes with its value partly zeroed).
    Returns the base path, the segment and the damaged bundle's header."""
    from tank_log.storage.segment import Segment

    src = os.path.join(data_dir("A_multi"), "events", str(pid))
    base = copy_tree(src, str(tmp_path / "base" / "t" / "0"))
    segment = os.path.join(base, sorted(f for f in os.listdir(base) if f.endswith(".ilog"))[0])
    headers = list(Segment(segment).bundles())
    data, h = open(segment, "rb").read(), headers[len(headers) // 2]
    with open(segment, "wb") as fh:
        if kind == "dup":
            fh.write(data[: h.offset + h.size] + data[h.offset :])
        else:
            mid = h.offset + h.size // 2
            fh.write(data[:mid] + bytes(len(data) - mid))
    return str(tmp_path / "base"), segment, h


@pytest.mark.parametrize(("pid", "kind"), [(1, "dup"), (0, "zeros")])
def test_a_stream_that_skips_a_hole_hands_on_nothing_untrusted(spark, tmp_path, pid, kind):
    """With failOnDataLoss=false the stream handed on what a range decoded before its hole was found: rows renumbered
    by a duplicated bundle, and a message whose value was partly zeroed. Now only rows the evidence trusts come out,
    and the loss names the file, offset and seqs."""

    base, segment, h = _damaged_partition(tmp_path, pid, kind)
    first, last = (int(x) for x in os.path.basename(segment).split("_")[0].split("-"))
    lost_from, at = (first, None) if kind == "dup" else (h.first_seq, h.offset)
    loss_log = str(tmp_path / "loss.jsonl")
    s = Stream(spark, base, str(tmp_path / "ck"), failOnDataLoss="false", dataLossLog=loss_log).step()
    s.stop()
    truth = {seq: value.hex().upper() for seq, _, _, value in load_dump("A_multi")[("events", pid)]}
    got = sorted((r.seq, bytes(r.value).hex().upper()) for r in s.rows)
    assert got == sorted((seq, v) for seq, v in truth.items() if not lost_from <= seq <= last)
    (entry,) = read_data_loss_log(loss_log)
    assert (entry["from_seq"], entry["to_seq"]) == (lost_from, last)
    assert entry["hole"].startswith(segment if at is None else f"{segment} @{at}: seqs {lost_from}..{last} not read")


@pytest.mark.parametrize("kind", ["lost", "overlap"])
def test_a_stream_that_skips_overlaps_and_lost_segments_names_them(spark, tmp_path, kind):
    """A segment lost beside its index, or two files claiming the same seqs: with failOnDataLoss=false the stream
    failed (a plain format error, not a hole it could skip), or before that read both files. Now it hands on nothing
    of what cannot be trusted and logs the seqs with the file: the lost segment's, or every seq of an overlapping
    partition."""
    base = copy_tree(os.path.join(data_dir("A_multi"), "events", "1"), str(tmp_path / "base" / "t" / "0"))
    lost = os.path.join(base, "1005-2828_1795261032.ilog")
    second = os.path.join(base, "2829-4682_1795261032.ilog")
    if kind == "overlap":  # 1005-2828 and 2829-4682 compacted into one output; the second input resurrected
        with open(os.path.join(base, "1005-4682_1795261032.ilog"), "wb") as fh:
            fh.write(open(lost, "rb").read() + open(second, "rb").read())
    os.unlink(lost)
    loss_log = str(tmp_path / "loss.jsonl")
    s = Stream(spark, str(tmp_path / "base"), str(tmp_path / "ck"), failOnDataLoss="false", dataLossLog=loss_log)
    got = s.step().seqs()
    s.stop()
    (entry,) = read_data_loss_log(loss_log)
    if kind == "lost":
        want = [seq for seq, _, _, _ in load_dump("A_multi")[("events", 1)] if not 1005 <= seq <= 2828]
        assert got == {("t", 0): want}
        assert (entry["from_seq"], entry["to_seq"]) == (1005, 2828)
        assert entry["hole"].startswith(f"{os.path.join(base, '1005.index')}: seqs 1005..2828 not read ([lost-segment]")
    else:
        assert got == {}
        assert (entry["from_seq"], entry["to_seq"]) == (1, 8496)
        assert entry["hole"].startswith(f"{second}: seqs 1..8496 not read ([overlap]")
