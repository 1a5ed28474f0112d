"""The latest message of each key among Arrow rows, by compaction's rule (docs/FORMAT.md §6.2), in bulk: per key the
row with the highest seq, marked when it is a tombstone (`messages.tombstones`); rows without a key are counted and
left out. What a current-state table holds of a partition, and the reduction that gives its MERGE one row per key."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tank_log.format.messages import tombstones

TOMBSTONE = "tombstone"  # the bool column `latest_per_key` adds: the key's latest message is a tombstone
ROW = "__row"  # a row number, within the reduction only


@dataclass(frozen=True)
class LatestRows:
    """`rows`: one row per key (within the scope columns), its latest, with a `TOMBSTONE` column; `keyless`: the
    rows without a key that were left out."""

    rows: pa.Table
    keyless: int


def latest_per_key(rows: pa.Table, scope: Sequence[str] = ()) -> LatestRows:
    """Reduce `rows` (columns `key`, `seq`, `value` and the `scope` columns, e.g. topic and partition) to the
    latest row of each key within its scope. Rows that already carry a `TOMBSTONE` column (an earlier reduction's
    output, whose values may have been decoded since) keep it: reducing in steps gives what one reduction gives."""
    keyed = pc.is_valid(rows["key"])
    keyless = len(rows) - int(pc.sum(keyed).as_py() or 0)
    if keyless:
        rows = rows.filter(keyed)
    if TOMBSTONE not in rows.column_names:
        lengths = pc.binary_length(rows["value"]).to_numpy(zero_copy_only=False)
        rows = rows.append_column(TOMBSTONE, pa.array(tombstones(np.ones(len(lengths), bool), lengths)))
    by = [*scope, "key"]
    # by seq, then the highest row number of each (scope, key) in a hash aggregation: faster than sorting by the keys
    rows = rows.sort_by("seq")
    numbered = rows.select(by).append_column(ROW, pa.array(np.arange(len(rows), dtype=np.int64)))
    last = numbered.group_by(by).aggregate([(ROW, "max")])[f"{ROW}_max"].to_numpy()
    return LatestRows(rows.take(pa.array(np.sort(last))), keyless)  # in seq order
