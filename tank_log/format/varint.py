"""TANK's 32-bit varint (docs/FORMAT.md §3.2): unsigned LEB128, at most 5 bytes, values < 2**32."""

from __future__ import annotations

from tank_log.errors import TankFormatError

U32_MAX = 0xFFFFFFFF
U64_MAX = (1 << 64) - 1  # sequence numbers and timestamps are u64 (§3.6, §3.7)


def encode_varint(value: int) -> bytes:
    """Canonical (minimal) encoding: 1 byte < 2**7, 2 < 2**14, 3 < 2**21, 4 < 2**28, else 5.

    Raises:
        ValueError: a value outside u32.
    """
    if not 0 <= value <= U32_MAX:
        raise ValueError(f"varint value out of u32 range: {value}")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def varint_size(value: int) -> int:
    """Number of bytes of the canonical encoding of `value`."""
    return 1 if value < 1 << 7 else 2 if value < 1 << 14 else 3 if value < 1 << 21 else 4 if value < 1 << 28 else 5


def decode_varint(buf: bytes | bytearray | memoryview, pos: int, end: int | None = None) -> tuple[int, int]:
    """Decode the varint at `pos`; return (value, position after it).

    Bounds-checked: raises TankFormatError when the varint runs past `end` (default: len(buf)) or is longer than
    5 bytes / overflows u32 (the broker silently drops such bits; no writer produces them).

    Raises:
        TankFormatError: a varint running past the buffer.
    """
    if end is None:
        end = len(buf)
    result = 0
    shift = 0
    p = pos
    while True:
        if p >= end:
            raise TankFormatError("varint runs past the end of the data", offset=pos)
        byte = buf[p]
        p += 1
        if shift == 28:
            if byte > 0x0F:
                raise TankFormatError("varint longer than 5 bytes or above 2**32-1", offset=pos)
            return result | (byte << 28), p
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, p
        shift += 7


def unframed_size(framed_size: int) -> int:
    """Bundle length L given len(varint(L)) + L (canonical varint).

    Raises:
        ValueError: a size no framed bundle can have.
    """
    for k in range(1, 6):
        if varint_size(framed_size - k) == k:
            return framed_size - k
    raise ValueError(f"no canonical framing has size {framed_size}")
