"""Raw Snappy blocks (docs/FORMAT.md §3.4: one raw block per message set, not the framing format).

Compression goes through python-snappy. Decompression is on the hot path (one call per bundle), so it calls
python-snappy's own backend, cramjam, directly: python-snappy's `decompress` adds a copy to `bytes` and ~0.4 µs
per call, which halves the scan rate of 1-message Snappy bundles (bench/RESULTS.md).
"""

from __future__ import annotations

from typing import Any

import cramjam
import snappy

from tank_log.errors import TankFormatError
from tank_log.format.varint import decode_varint

# A Snappy element expands at most 64 bytes per 3 input bytes (copy with 2-byte offset), so a block claiming more
# than ~21.4x its size is corrupt. Checking first keeps a flipped length byte from allocating gigabytes.
MAX_EXPANSION = 22
_decompress_raw = cramjam.snappy.decompress_raw
_decompress_raw_into = cramjam.snappy.decompress_raw_into


def compress(data: bytes) -> bytes:
    return bytes(snappy.compress(data))


def check_claim(data: Any) -> None:
    """Reject a block whose uncompressed-length header is unreadable or impossibly large.

    Raises:
        TankFormatError: the claim cannot be right.
    """
    if not len(data):
        raise TankFormatError("bad Snappy block: empty")
    try:
        claimed, _ = decode_varint(data, 0)
    except TankFormatError:
        raise TankFormatError("bad Snappy block: bad uncompressed-length varint") from None
    if claimed > MAX_EXPANSION * len(data) + 64:
        raise TankFormatError(f"bad Snappy block: claims {claimed} bytes from {len(data)}")


def decompress(data: Any) -> Any:
    """Decompress a raw Snappy block into a bytes-like object.

    Raises:
        TankFormatError: a corrupt block (no offset: the caller locates it).
    """
    if not len(data) or data[0] >= 0x80:  # a claimed length >= 128: bound it before allocating
        check_claim(data)
    try:
        return _decompress_raw(data)
    except Exception as err:  # cramjam.DecompressionError and friends
        raise TankFormatError(f"bad Snappy block: {err or type(err).__name__}") from None


def decompress_into(data: Any, out: Any) -> int:
    """Decompress a raw Snappy block into the writable buffer `out` (sized from the block's length header, which the
    caller has bounded); returns the bytes written.

    Raises:
        TankFormatError: a corrupt block, or one that does not fill `out` exactly.
    """
    try:
        return int(_decompress_raw_into(data, out))
    except Exception as err:
        raise TankFormatError(f"bad Snappy block: {err or type(err).__name__}") from None
