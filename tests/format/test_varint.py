import pytest
from hypothesis import given
from hypothesis import strategies as st

from tank_log.errors import TankFormatError
from tank_log.format.varint import decode_varint, encode_varint, varint_size


@given(st.integers(0, 2**32 - 1))
def test_round_trip_and_canonical_size(value):
    enc = encode_varint(value)
    assert len(enc) == varint_size(value) <= 5
    assert decode_varint(enc + b"\xff", 0) == (value, len(enc))


@pytest.mark.parametrize(
    "value,size",
    [(0, 1), (127, 1), (128, 2), (2**14 - 1, 2), (2**14, 3), (2**21, 4), (2**28 - 1, 4), (2**28, 5), (2**32 - 1, 5)],
)
def test_sizes(value, size):
    assert len(encode_varint(value)) == size


def test_encode_rejects_out_of_range():
    with pytest.raises(ValueError):
        encode_varint(2**32)
    with pytest.raises(ValueError):
        encode_varint(-1)


def test_decode_is_bounds_checked():
    with pytest.raises(TankFormatError) as e:
        decode_varint(b"\x80\x80", 0)
    assert e.value.offset == 0
    with pytest.raises(TankFormatError):
        decode_varint(b"\x05\x80", 1, 2)


def test_decode_rejects_overlong_and_overflow():
    with pytest.raises(TankFormatError):
        decode_varint(b"\xff\xff\xff\xff\x10", 0)  # bits above 32
    with pytest.raises(TankFormatError):
        decode_varint(b"\xff\xff\xff\xff\x8f\x01", 0)  # 6 bytes
    assert decode_varint(b"\xff\xff\xff\xff\x0f", 0) == (2**32 - 1, 5)


def test_non_minimal_is_readable():
    assert decode_varint(b"\x80\x00", 0) == (0, 2)
