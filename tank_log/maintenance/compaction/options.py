"""What a compaction run may do (options) and what it did to a partition (result)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tank_log.format.bundle import SnappyPolicy
from tank_log.maintenance.outcome import PartitionOutcome
from tank_log.maintenance.preflight import SafetyOptions
from tank_log.storage.writer import BundlePolicy

DEFAULT_KEY_STATE_BUDGET = 256 << 20


@dataclass(frozen=True)
class CompactionOptions(SafetyOptions):
    """How `compact_partition` runs: the safety options, and when and into what it compacts."""

    force: bool = False  # compact even when the dirty ratio is below the threshold
    min_cleanable_ratio: float | None = None  # None: the partition's log.cleaner.min.cleanable.ratio
    segment_bytes: int | None = None  # output size; None: the partition's log.segment.bytes
    min_compaction_lag_ms: int = 0  # segments whose newest message is younger stay out of this run
    tombstone_retention_ms: int | None = None  # None: keep tombstones forever (the broker's rule)
    drop_keyless: bool = False
    policy: BundlePolicy = BundlePolicy(max_messages=100, max_bytes=64 << 10, snappy=SnappyPolicy.WHEN_SMALLER)
    key_state_budget: int = DEFAULT_KEY_STATE_BUDGET  # bytes of pass 1's key state; more keys spill to disk
    now_ms: int | None = None  # for tests


@dataclass
class CompactionResult(PartitionOutcome):
    """One partition's outcome; `to_dict` is its entry in the JSON run report."""

    dirty_ratio: float | None = None
    range_first: int | None = None
    range_last: int | None = None
    segments_before: int = 0
    bytes_before: int = 0
    messages_before: int = 0
    segments_after: int = 0
    bytes_after: int | None = 0
    messages_after: int = 0
    distinct_keys: int = 0
    spill_buckets: int = 0  # key record files the keys past key_state_budget went to (0: they fitted in memory)
    spill_bytes: int = 0  # bytes of key records spilled
    tombstones_kept: int = 0
    tombstones_dropped: int = 0
    keyless_kept: int = 0
    keyless_dropped: int = 0
    key_state_bytes: int = 0  # the most the key state held: a key map + the survivors' 2 bits per input message
    bundles_skipped: int = 0  # input bundles pass 2 dropped whole from their headers, without decoding them
    outputs: list[str] = field(default_factory=list)
    damage: list[dict[str, object]] = field(default_factory=list)  # what made it refuse its input (file, offset, seqs)
