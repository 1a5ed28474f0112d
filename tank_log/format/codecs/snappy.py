"""Raw Snappy blocks (TANK_FORMAT.md §3.4: one raw block per message set, not the framing format).

Compression goes through python-snappy. Decompression is on the hot path (one call per bundle), so it calls
python-snappy's own backend, cramjam, directly: python-snappy's `decompress` adds a copy to `bytes` and ~0.4 µs
per call, which halves the scan rate of 1-message Snappy bundles (bench/RESULTS.md).
"""

from __future__ import annotations

import cramjam
import snappy

from tank_log.errors import TankFormatError
from tank_log.format.varint import decode_varint

# A Snappy element expands at most 64 bytes per 3 input bytes (copy with 2-byte offset), so a block claiming more
# than ~21.4x its size is corrupt. Checking first keeps a flipped length byte from allocating gigabytes.
_MAX_EXPANSION = 22
_decompress_raw = cramjam.snappy.decompress_raw


def compress(data: bytes) -> bytes:
    return bytes(snappy.compress(data))


def check_claim(data) -> None:
    """Reject a block whose uncompressed-length header is unreadable or impossibly large."""
    if not len(data):
        raise TankFormatError("bad Snappy block: empty")
    try:
        claimed, _ = decode_varint(data, 0)
    except TankFormatError:
        raise TankFormatError("bad Snappy block: bad uncompressed-length varint") from None
    if claimed > _MAX_EXPANSION * len(data) + 64:
        raise TankFormatError(f"bad Snappy block: claims {claimed} bytes from {len(data)}")


def decompress_raw(data):
    """Decompress without the claim check (the caller did it); errors are the backend's own."""
    return _decompress_raw(data)


def decompress(data):
    """Decompress a raw Snappy block into a bytes-like object; a corrupt block raises TankFormatError (offset
    filled in by the caller)."""
    check_claim(data)
    try:
        return _decompress_raw(data)
    except Exception as err:  # cramjam.DecompressionError and friends
        raise TankFormatError(f"bad Snappy block: {err or type(err).__name__}") from None
