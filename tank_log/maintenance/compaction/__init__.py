"""Compaction of keyed partitions (docs/FORMAT.md §6), crash-safe and with memory bounded by distinct keys.

Semantics are the broker's (§6.2), so a partition compacted here reads as if the broker had compacted it:
- only RO segments; the active segment is never read or modified;
- keyed messages: only the highest seq per key survives; a tombstone (key + empty value) survives as its key's latest
  value — unless `tombstone_retention_ms` is set: then tombstones older than that (by message ts) are dropped too,
  which goes beyond the broker (like Kafka's delete.retention.ms);
- keyless non-empty messages survive (unless `drop_keyless`, Kafka's behaviour); keyless empty ones are dropped;
- the message with the highest seq of the compacted range always survives: dropping it would open a seq gap before
  the active segment, on which the broker aborts (§4.4, §11.23 — the broker's own compaction has this bug);
- survivors keep seq, ts, key, value and order (never the broker's key-order bug, §11.24); gaps are encoded as
  sparse bundles (§3.6).

Two passes, at any key count. Pass 1 reads the inputs once and finds, for every keyed message, whether it is its
key's latest, exactly (`key_state.KeyMap`, in the compiled core: open addressing over the real key bytes, no
digests, so no collisions; ~23 B per 11-byte key), and marks keyless messages and tombstones (`survivors`: two bits
per input message). When the keys do not fit `key_state_budget` (default 256 MiB), the rest go to key record files
by key hash and are decided bucket by bucket within the same budget (`spill`): one more read of the keys, not of
the input, where Kafka's cleaner would re-read its input once per round. Pass 2 streams the inputs again, skips
bundles without a survivor from their headers, and writes survivors: bundles that survive whole are copied
verbatim when large enough, the rest are re-bundled (default 100 messages / 64 KiB, Snappy when it pays).

File protocol (compatible with the broker's, §6.4): outputs are written under `.`-prefixed temporary names and
fsynced, then `storage.swap.swap_in` puts them in place of the inputs (`.cleaned` → `.swap`, inputs → `.old`, strip
`.swap`, unlink `.old`); `storage.swap.repair_partition` recovers from a crash at any point. Finally
the partition's `.cleanup.log` record is set to the last compacted seq, atomically.
"""

from tank_log.maintenance.compaction.compact import compact_partition
from tank_log.maintenance.compaction.options import CompactionOptions, CompactionResult
from tank_log.maintenance.compaction.passes import dirty_ratio, select_inputs

__all__ = ["CompactionOptions", "CompactionResult", "compact_partition", "dirty_ratio", "select_inputs"]
