"""Writing new segments (docs/FORMAT.md Appendix B).

Bundles are non-sparse only when they continue the running counter, sparse otherwise (§3.6); Snappy per a policy
(§3.4); index entries by the append rule (§4.3) or the compaction rule (§6.3). Files are written under
`.`-prefixed temporary names, fsynced, and renamed into place index first, then log, then the directory is fsynced
(Appendix B step 4) — or handed back un-renamed (`finish`) for callers with their own protocol (compaction).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from tank_log.format.bundle import (
    Message,
    SnappyPolicy,
    encode_bundle,
    frame,
    frame_bundles,
    is_contiguous,
    messages_of,
)
from tank_log.format.index import DEFAULT_INDEX_INTERVAL, REL_SEQ_LIMIT, encode_index
from tank_log.format.messages import MessageColumns
from tank_log.format.names import format_active_name, format_index_name, format_ro_name
from tank_log.format.varint import U32_MAX, U64_MAX, unframed_size
from tank_log.storage.fsutil import fsync_dir, remove_if_exists, temp_path

_BUNDLES_PER_BATCH = 64  # add_columns encodes this many bundles a call: work past a segment's roll is wasted
SEGMENT_SIZE_LIMIT = (1 << 32) - 1  # §8: segment sizes and index offsets are u32
# what add and add_columns refuse: a seq the segment's index cannot reach
BEYOND_INDEX_REACH = "relative seq beyond 2**31 needs a _64 index (§4.6); start a new segment"


@dataclass(frozen=True)
class BundlePolicy:
    """How messages are grouped into bundles.

    Defaults favour read speed and compression (100 messages / 64 KiB, Snappy when it pays) over the broker's
    5-message compaction bundles (§6.3).
    """

    max_messages: int = 100
    max_bytes: int = 64 << 10  # Σ(key + value + 8) per bundle, like compaction's 64 KiB cut
    snappy: SnappyPolicy = SnappyPolicy.WHEN_SMALLER


@dataclass(frozen=True)
class WrittenSegment:
    """A finished segment: temp files (fsynced), or final files after `commit`."""

    directory: str
    base: int
    last: int
    ts: int | None
    active: bool
    log_path: str
    index_path: str
    size: int
    messages: int
    bundles: int

    @property
    def log_name(self) -> str:
        return format_active_name(self.base, self.ts) if self.active else format_ro_name(self.base, self.last, self.ts)

    @property
    def index_name(self) -> str:
        return format_index_name(self.base)


class SegmentWriter:
    """Streams messages (or pre-encoded bundles) into one new segment.

    `index_rule`: "append" (`log.index.interval.bytes`, §4.3) or "compaction" (> 10000 B or > 128 messages, §6.3).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        active: bool = False,
        ts: int | None = None,
        policy: BundlePolicy = BundlePolicy(),
        index_rule: str = "append",
        index_interval: int = DEFAULT_INDEX_INTERVAL,
    ):
        if index_rule not in ("append", "compaction"):
            raise ValueError(f"unknown index rule {index_rule!r}")
        self.directory = os.fspath(directory)
        self.active = active
        self.ts = int(time.time()) if ts is None else ts
        self.policy = policy
        self.index_rule = index_rule
        self.index_interval = index_interval
        self.base: int | None = None
        self.last: int | None = None
        self.size = 0
        self.messages = 0
        self.bundles = 0
        self._pending: list[Message] = []
        self._pending_bytes = 0
        self._entries: list[tuple[int, int]] = []
        self._since_entry: int | None = None  # append rule: bytes since the last indexed bundle start
        self._since_msgs = 0
        self._fh: BinaryIO | None = None
        self._log_tmp = temp_path(self.directory, "segment.log")
        self._index_tmp = temp_path(self.directory, "segment.index")
        self._closed = False

    # ---- input -------------------------------------------------------------------------------------------------

    @property
    def first_seq(self) -> int | None:
        """The segment's first seq so far (written or pending), None while empty."""
        if self.base is not None:
            return self.base
        return self._pending[0].seq if self._pending else None

    @property
    def expected_next(self) -> int | None:
        """Seq a message must have to continue the running counter (non-sparse)."""
        if self._pending:
            return self._pending[-1].seq + 1
        return None if self.last is None else self.last + 1

    def add(self, message: Message) -> None:
        """Raises:
        ValueError: a seq not above the previous one, a key over 255 bytes, or a relative seq beyond 2**31 (§4.6).
        """
        seq, _, key, value = message
        if self._pending:
            prev = self._pending[-1][0]
        else:
            prev = self.last if self.last is not None else 0
        if seq <= prev:
            raise ValueError(f"sequence numbers must increase (and start at 1, §3.6): {seq} after {prev}")
        if key is not None and len(key) > 255:
            raise ValueError(f"key of {len(key)} bytes exceeds 255 (§3.8)")
        if self.base is not None and seq - self.base >= REL_SEQ_LIMIT:
            raise ValueError(BEYOND_INDEX_REACH)
        if self._pending and seq - self._pending[0].seq - 1 > U32_MAX:
            self.flush_bundle()  # a sparse bundle's span is a u32 varint (§3.3): a larger seq gap starts a new one
        self._pending.append(message)
        self._pending_bytes += (len(key) if key else 0) + len(value) + 8
        if len(self._pending) >= self.policy.max_messages or self._pending_bytes >= self.policy.max_bytes:
            self.flush_bundle()

    def add_columns(self, cols: MessageColumns, stop_past_size: int | None = None) -> int:
        """Bulk `add` of messages given as columns (messages.MessageColumns): the same bundles and bytes as adding
        them one by one, encoded from the columns without a Python object per message.

        Returns how many rows were added: all of them; fewer when a bundle took the segment past `stop_past_size`
        bytes; or fewer when the next row's seq is too far from the segment's first for its index (§4.6) — the
        caller then starts a new segment with the rest.

        Raises:
            ValueError: seqs not increasing (or not above the previous one), or a key over 255 bytes (§3.8).
        """
        n = len(cols)
        seq = cols.seq
        if not n:
            return 0
        prev = self._pending[-1].seq if self._pending else self.last if self.last is not None else 0
        if int(seq[0]) <= prev or (n > 1 and not bool((seq[1:] > seq[:-1]).all())):
            raise ValueError(f"sequence numbers must increase (and start at 1, §3.6): rows from seq {int(seq[0])}")
        keyed = cols.key_off >= 0
        if bool((cols.key_len[keyed] > 255).any()):
            raise ValueError("key over 255 bytes (§3.8)")
        first = self.first_seq if self.first_seq is not None else int(seq[0])
        fits = _first_at_least(seq, first + REL_SEQ_LIMIT)
        sizes = np.where(keyed, cols.key_len, 0) + cols.val_len + 8  # what `add` counts per message
        ends = np.concatenate(([0], np.cumsum(sizes)))  # ends[k]: Σ sizes of rows < k
        i = 0
        if self._pending and fits:  # top up the open bundle: it is full after the row where `add` would flush it
            room = self.policy.max_messages - len(self._pending)
            i = min(room, int(np.searchsorted(ends, self.policy.max_bytes - self._pending_bytes)))
            if i > fits:
                self._hold(cols, 0, fits, ends)
                return fits
            self._hold(cols, 0, i, ends)
            self.flush_bundle()
            if stop_past_size is not None and self.size > stop_past_size:
                return i
        # rows up to `fits` lie within 2**31 of the segment's first seq, so no sparse span needs `add`'s cut at 2**32
        while i < fits:
            bounds = _bundle_bounds(ends, i, fits, self.policy)
            if len(bounds) == 1:  # no row in reach fills a bundle: the rest stays open for the next rows
                self._hold(cols, i, fits, ends)
                return fits
            i = self._append_rows(cols, bounds, stop_past_size)
            if stop_past_size is not None and self.size > stop_past_size:
                return i
        return fits

    def _hold(self, cols: MessageColumns, lo: int, hi: int, ends: np.ndarray) -> None:
        """Rows [lo, hi) join the open bundle (`add` without its checks: add_columns made them, for all rows)."""
        self._pending += messages_of(cols.slice(lo, hi))
        self._pending_bytes += int(ends[hi] - ends[lo])

    def _append_rows(self, cols: MessageColumns, bounds: np.ndarray, stop_past_size: int | None) -> int:
        """Append the bundles of rows [bounds[k], bounds[k + 1]), up to the one that takes the segment past
        `stop_past_size`; returns the row after the last appended."""
        framed, frame_ends = frame_bundles(cols, bounds, self.expected_next, self.policy.snappy)
        view, start, seq = memoryview(framed), 0, cols.seq
        for k, stop in enumerate(frame_ends.tolist()):
            lo, hi = int(bounds[k]), int(bounds[k + 1])
            self._append(view[start:stop], int(seq[lo]), int(seq[hi - 1]), hi - lo)
            start = stop
            if stop_past_size is not None and self.size > stop_past_size:
                return hi
        return int(bounds[-1])

    def add_all(self, messages: Iterable[Message]) -> None:
        for m in messages:
            self.add(m)

    def flush_bundle(self) -> None:
        """Encode the pending messages as one bundle."""
        if not self._pending:
            return
        msgs = self._pending
        expected = msgs[0].seq if self.last is None else self.last + 1  # a segment's first bundle sets its base
        bundle = encode_bundle(msgs, sparse=not is_contiguous(msgs, expected), codec=self.policy.snappy)
        self._pending, self._pending_bytes = [], 0
        self._append(frame(bundle), msgs[0].seq, msgs[-1].seq, len(msgs))

    def add_bundle(self, framed: bytes, first_seq: int, last_seq: int, count: int, *, sparse: bool) -> None:
        """Append an already-encoded, framed bundle (e.g. copied from another segment).

        A non-sparse bundle must continue the running counter (its seqs are implicit, §3.6).

        Raises:
            ValueError: a bundle that does not follow the previous one (or continue the counter when non-sparse).
        """
        self.flush_bundle()
        if not sparse and self.last is not None and first_seq != self.last + 1:
            raise ValueError(f"non-sparse bundle at seq {first_seq} does not continue the counter ({self.last + 1})")
        if self.last is not None and first_seq <= self.last:
            raise ValueError(f"bundle at seq {first_seq} does not follow {self.last}")
        self._append(framed, first_seq, last_seq, count)

    # ---- output ------------------------------------------------------------------------------------------------

    def _append(self, framed: bytes | memoryview, first: int, last: int, count: int) -> None:
        if self.base is None:
            self.base = first
            self._fh = open(self._log_tmp, "wb")
        base, since, fh = self.base, self._since_entry, self._fh
        assert fh is not None  # opened with the first bundle
        if self.size + len(framed) > SEGMENT_SIZE_LIMIT:
            raise ValueError("segment would exceed 4 GiB (§8); start a new segment")
        if self.index_rule == "append":
            if since is None or since > self.index_interval:
                self._entries.append((first - base, self.size))
                since = 0
            since += len(framed)
        else:
            if not self._entries or since is None or since > 10000 or self._since_msgs > 128:
                self._entries.append((first - base, self.size))
                since = self._since_msgs = 0
            since += unframed_size(len(framed))  # bundle bytes without the length varint (§6.3)
            self._since_msgs += count
        self._since_entry = since
        fh.write(framed)
        self.size += len(framed)
        self.messages += count
        self.bundles += 1
        self.last = last

    def finish(self) -> WrittenSegment | None:
        """Flush, fsync both temp files and return them un-renamed (None if nothing was written)."""
        self.flush_bundle()
        self._closed = True
        if self._fh is None or self.base is None or self.last is None:
            return None
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        with open(self._index_tmp, "wb") as fh:
            fh.write(encode_index(self._entries))
            fh.flush()
            os.fsync(fh.fileno())
        return WrittenSegment(
            self.directory,
            self.base,
            self.last,
            self.ts,
            self.active,
            self._log_tmp,
            self._index_tmp,
            self.size,
            self.messages,
            self.bundles,
        )

    def close(self) -> WrittenSegment | None:
        """Finish and move into place under the final names."""
        written = self.finish()
        return None if written is None else commit(written)

    def abort(self) -> None:
        """Drop everything written so far (also after a failed write: a full disk fails the close's flush too)."""
        if self._fh is not None and not self._fh.closed:
            try:
                self._fh.close()
            except OSError:
                pass  # the descriptor is closed anyway; the file is dropped below
        for path in (self._log_tmp, self._index_tmp):
            remove_if_exists(path)
        self._closed = True

    def __enter__(self) -> SegmentWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._closed:
            self.close()


def _bundle_bounds(ends: np.ndarray, i: int, fits: int, policy: BundlePolicy) -> np.ndarray:
    """Where `add` would cut rows i.. (< fits) into full bundles (`ends[k]`: Σ of the row sizes before row k), up to
    _BUNDLES_PER_BATCH of them: [i, end of the first, end of the second, ...]."""
    bounds = [i]
    while len(bounds) <= _BUNDLES_PER_BATCH:
        start = bounds[-1]
        end = min(start + policy.max_messages, int(np.searchsorted(ends, ends[start] + policy.max_bytes)))
        if end > fits:  # no row before `fits` fills this bundle
            break
        bounds.append(end)
    return np.array(bounds, dtype=np.int64)


def _first_at_least(seq: np.ndarray, value: int) -> int:
    """Index of the first seq >= value in increasing u64 seqs (len(seq) when value is beyond u64)."""
    return len(seq) if value > U64_MAX else int(np.searchsorted(seq, np.uint64(value)))


def commit(written: WrittenSegment) -> WrittenSegment:
    """Rename a finished segment into place: index first, then log, then fsync the directory (Appendix B step 4).

    Refuses to overwrite existing files.

    Raises:
        FileExistsError: a file already has the final name (nothing is overwritten).
    """
    d = written.directory
    index_final = os.path.join(d, written.index_name)
    log_final = os.path.join(d, written.log_name)
    for path in (index_final, log_final):
        if os.path.exists(path):
            raise FileExistsError(f"refusing to overwrite {path}")
    os.rename(written.index_path, index_final)
    os.rename(written.log_path, log_final)
    fsync_dir(d)
    return WrittenSegment(
        d,
        written.base,
        written.last,
        written.ts,
        written.active,
        log_final,
        index_final,
        written.size,
        written.messages,
        written.bundles,
    )


def write_segment(
    directory: str | os.PathLike[str], messages: Iterable[Message], **kwargs: Any
) -> WrittenSegment | None:
    """Write `messages` (increasing seqs) as one new segment; see SegmentWriter for options."""
    writer = SegmentWriter(directory, **kwargs)
    try:
        writer.add_all(messages)
    except BaseException:
        writer.abort()
        raise
    return writer.close()
