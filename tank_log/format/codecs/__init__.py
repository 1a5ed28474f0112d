"""Compression codecs of bundle message sets (docs/FORMAT.md §3.4), keyed by the 2-bit codec id of the flags.

Adding a codec = one module here (compress, decompress, max_expansion) + one member of `Codec` + one entry in
`CODECS`. The walker (`format/decode.py`) and the encoder (`format/bundle.py`) only go through this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

from tank_log.format.codecs import snappy


class Codec(IntEnum):
    """The codec id stored in bits 0-1 of the bundle flags (§3.3)."""

    NONE = 0
    SNAPPY = 1


@dataclass(frozen=True)
class BlockCodec:
    """How one codec compresses and decompresses a whole message set.

    `decompress` raises TankFormatError (without offset; the walker adds it) for a corrupt block and must bound
    what it allocates; `decompress_into` writes into a buffer sized from the block's length header (the compiled
    walk reads Snappy's, §3.4) and returns the bytes written; `max_expansion` bounds the uncompressed size per
    compressed byte (count plausibility). `raw_snappy`: the blocks are raw Snappy, which the compiled walk decodes
    itself (no Python call per message set) and must accept and reject exactly as `decompress_into` does.
    """

    codec: Codec
    compress: Callable[[bytes], bytes]
    decompress: Callable[[memoryview | bytes], bytes]
    decompress_into: Callable[[memoryview | bytes, memoryview], int]
    max_expansion: int
    raw_snappy: bool = False


CODECS: dict[int, BlockCodec] = {
    Codec.SNAPPY: BlockCodec(
        Codec.SNAPPY, snappy.compress, snappy.decompress, snappy.decompress_into, snappy.MAX_EXPANSION, True
    ),
}


def block_codec(codec_id: int) -> BlockCodec:
    """The codec for a non-zero codec id; KeyError for an id no writer uses (§3.4: only 0 and 1 exist)."""
    return CODECS[codec_id]
