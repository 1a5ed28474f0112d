"""What the compiled value decoders (`_avro_fast.pyx`, `_protobuf_fast.pyx`) share: inline C helpers."""

from libc.stdint cimport uint8_t


cdef inline bint valid_utf8(const uint8_t* s, Py_ssize_t n) noexcept nogil:
    """Whether `s` is valid UTF-8 as Python decodes it and upb checks it (no overlong forms, no surrogates, at most
    U+10FFFF)."""
    cdef Py_ssize_t i = 0
    cdef uint8_t b, b1
    while i < n:
        b = s[i]
        if b < 0x80:
            i += 1
            continue
        if b < 0xC2 or b > 0xF4:
            return False
        if b < 0xE0:
            if i + 1 >= n or (s[i + 1] & 0xC0) != 0x80:
                return False
            i += 2
            continue
        if i + 1 >= n:
            return False
        b1 = s[i + 1]
        if (b1 & 0xC0) != 0x80:
            return False
        if b < 0xF0:
            if (b == 0xE0 and b1 < 0xA0) or (b == 0xED and b1 > 0x9F):
                return False
            if i + 2 >= n or (s[i + 2] & 0xC0) != 0x80:
                return False
            i += 3
            continue
        if (b == 0xF0 and b1 < 0x90) or (b == 0xF4 and b1 > 0x8F):
            return False
        if i + 3 >= n or (s[i + 2] & 0xC0) != 0x80 or (s[i + 3] & 0xC0) != 0x80:
            return False
        i += 4
    return True
