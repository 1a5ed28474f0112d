"""Raw Snappy blocks (TANK_FORMAT.md §3.4: one raw block per message set, not the framing format)."""

from __future__ import annotations

import snappy

from .errors import TankFormatError
from .varint import decode_varint

# A Snappy element expands at most 64 bytes per 3 input bytes (copy with 2-byte offset), so a block claiming more
# than ~21.4x its size is corrupt. Checking first keeps a flipped length byte from allocating gigabytes.
_MAX_EXPANSION = 22


def compress(data: bytes) -> bytes:
    return bytes(snappy.compress(data))


def decompress(data) -> bytes:
    """Decompress a raw Snappy block; a corrupt block raises TankFormatError (offset filled in by the caller)."""
    try:
        claimed, _ = decode_varint(data, 0)
    except TankFormatError:
        raise TankFormatError("bad Snappy block: bad uncompressed-length varint") from None
    if claimed > _MAX_EXPANSION * len(data) + 64:
        raise TankFormatError(f"bad Snappy block: claims {claimed} bytes from {len(data)}")
    try:
        out = snappy.decompress(data)
    except Exception as err:  # python-snappy raises several types depending on its backend
        raise TankFormatError(f"bad Snappy block: {err or type(err).__name__}") from None
    if len(out) != claimed:
        raise TankFormatError("bad Snappy block: length mismatch")
    return out
