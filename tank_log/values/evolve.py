"""Schema evolution of a typed table (placeholder until the rules land)."""

from __future__ import annotations

import pyarrow as pa


def evolve(table_type: pa.StructType, new_type: pa.StructType) -> pa.StructType:
    """The merged type of a compatible change."""
    return new_type
