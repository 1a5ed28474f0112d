# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled JSON lines of `tank-log dump` (`dump.py` is the pure-Python code it speeds up; `_dump_lines.pyi`
gives its types): the same text as json.dumps of each message's record, written 8 bytes at a time."""

from cpython.buffer cimport PyBUF_WRITE
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.memoryview cimport PyMemoryView_FromMemory
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

cimport cython

import numpy as np

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    /* JSON lines (`tank-log dump`), 8 bytes at a time. tl_json_text: s as a JSON string when every byte is printable
       ASCII (0x20..0x7e; '"' and backslash escaped), else null; returns the bytes written. Per word of 8 bytes, exact
       masks (no carry crosses a byte) flag the bytes to escape and those not printable: a word with neither is copied
       whole, one with bytes to escape in pieces between them (8-byte copies that overshoot into what follows: the
       output's bound leaves room, and the input is read no further than 8 bytes past the word, within the text). */
    #define TL_LOW7 0x7F7F7F7F7F7F7F7FULL
    #define TL_HIGHS 0x8080808080808080ULL
    static inline uint64_t tl_word(const uint8_t *p) {  /* byte k of p at bits 8k..8k+7 */
        uint64_t x;
        memcpy(&x, p, 8);
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        x = __builtin_bswap64(x);
    #endif
        return x;
    }
    static inline uint64_t tl_bytes_equal(uint64_t x, uint64_t pattern) {
        uint64_t y = x ^ pattern;
        return ~(((y & TL_LOW7) + TL_LOW7) | y) & TL_HIGHS;
    }
    static inline uint64_t tl_unprintable(uint64_t x) {  /* below 0x20, 0x7f, or above */
        uint64_t low = x & TL_LOW7;
        return (~(low + 0x6060606060606060ULL) | x | (low + 0x0101010101010101ULL)) & TL_HIGHS;
    }
    static size_t tl_json_text(uint8_t *o, const uint8_t *s, size_t n) {
        uint8_t *start = o;
        size_t i = 0, k, at;
        uint64_t w, esc;
        uint8_t c;
        *o++ = 34;
        for (; i + 8 <= n; i += 8) {
            w = tl_word(s + i);
            if (tl_unprintable(w)) {
                memcpy(start, "null", 4);
                return 4;
            }
            esc = tl_bytes_equal(w, 0x2222222222222222ULL) | tl_bytes_equal(w, 0x5C5C5C5C5C5C5C5CULL);
            if (!esc) {
                memcpy(o, s + i, 8);
                o += 8;
                continue;
            }
            if (i + 16 > n) {  /* near the end: byte by byte (the copies below read up to 8 bytes ahead) */
                for (k = 0; k < 8; k++) {
                    c = s[i + k];
                    if (c == 34 || c == 92) *o++ = 92;
                    *o++ = c;
                }
                continue;
            }
            k = 0;  /* the word's bytes written so far: copied 8 at a time up to each byte to escape */
            while (esc) {
                at = (size_t)__builtin_ctzll(esc) >> 3;
                memcpy(o, s + i + k, 8);
                o += at - k;
                *o++ = 92;
                *o++ = s[i + at];
                k = at + 1;
                esc &= esc - 1;
            }
            memcpy(o, s + i + k, 8);
            o += 8 - k;
        }
        for (; i < n; i++) {
            c = s[i];
            if (c < 0x20 || c > 0x7E) {
                memcpy(start, "null", 4);
                return 4;
            }
            if (c == 34 || c == 92) *o++ = 92;  /* '"' and backslash are escaped */
            *o++ = c;
        }
        *o++ = 34;
        return (size_t)(o - start);
    }
    /* base64 (RFC 4648, padded): 12 bits to two characters by one table lookup */
    static uint16_t tl_b64_pairs[4096];
    static void tl_b64_init(void) {
        static const char *a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        int i;
        for (i = 0; i < 4096; i++) {
            uint8_t pair[2] = {(uint8_t)a[i >> 6], (uint8_t)a[i & 63]};
            memcpy(&tl_b64_pairs[i], pair, 2);
        }
    }
    static size_t tl_b64(uint8_t *o, const uint8_t *s, size_t n) {
        uint8_t *start = o;
        size_t i = 0;
        uint32_t v;
        uint64_t x;
        for (; i + 8 <= n; i += 6) {  /* 6 bytes (of an 8-byte load) to 8 characters */
            memcpy(&x, s + i, 8);
    #if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_BIG_ENDIAN__
            x = __builtin_bswap64(x);
    #endif
            memcpy(o, &tl_b64_pairs[x >> 52], 2);
            memcpy(o + 2, &tl_b64_pairs[(x >> 40) & 0xFFF], 2);
            memcpy(o + 4, &tl_b64_pairs[(x >> 28) & 0xFFF], 2);
            memcpy(o + 6, &tl_b64_pairs[(x >> 16) & 0xFFF], 2);
            o += 8;
        }
        for (; i + 3 <= n; i += 3) {
            v = ((uint32_t)s[i] << 16) | ((uint32_t)s[i + 1] << 8) | s[i + 2];
            memcpy(o, &tl_b64_pairs[v >> 12], 2);
            memcpy(o + 2, &tl_b64_pairs[v & 0xFFF], 2);
            o += 4;
        }
        if (n - i == 1) {
            v = (uint32_t)s[i] << 4;
            memcpy(o, &tl_b64_pairs[v], 2);
            o[2] = o[3] = 61;  /* = */
            o += 4;
        } else if (n - i == 2) {
            v = ((uint32_t)s[i] << 16) | ((uint32_t)s[i + 1] << 8);
            memcpy(o, &tl_b64_pairs[v >> 12], 2);
            memcpy(o + 2, &tl_b64_pairs[v & 0xFFF], 2);
            o[3] = 61;
            o += 4;
        }
        return (size_t)(o - start);
    }
    /* a u64 in decimal, two digits by one table lookup */
    static const char tl_digit_pairs[201] =
        "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
        "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
        "8081828384858687888990919293949596979899";
    static size_t tl_u64_text(uint8_t *o, uint64_t v) {
        uint8_t tmp[20];
        size_t k = 20, n;
        while (v >= 100) {
            k -= 2;
            memcpy(tmp + k, tl_digit_pairs + 2 * (v % 100), 2);
            v /= 100;
        }
        if (v >= 10) {
            k -= 2;
            memcpy(tmp + k, tl_digit_pairs + 2 * v, 2);
        } else {
            tmp[--k] = (uint8_t)('0' + v);
        }
        n = 20 - k;
        memcpy(o, tmp + k, n);
        return n;
    }
    """
    size_t tl_json_text(uint8_t *o, const uint8_t *s, size_t n) noexcept nogil
    size_t tl_b64(uint8_t *o, const uint8_t *s, size_t n) noexcept nogil
    void tl_b64_init() noexcept nogil
    size_t tl_u64_text(uint8_t *o, uint64_t v) noexcept nogil


cdef inline Py_ssize_t _put(uint8_t *o, Py_ssize_t w, const char *s, Py_ssize_t n) noexcept nogil:
    memcpy(o + w, s, n)
    return w + n


cdef inline Py_ssize_t _put_u64(uint8_t *o, Py_ssize_t w, uint64_t v) noexcept nogil:
    return w + <Py_ssize_t>tl_u64_text(o + w, v)


cdef inline Py_ssize_t _put_text(uint8_t *o, Py_ssize_t w, const uint8_t *s, Py_ssize_t n) noexcept nogil:
    """A JSON string when every byte is printable ASCII (0x20..0x7e), else null (the fixtures' dump format)."""
    return w + <Py_ssize_t>tl_json_text(o + w, s, n)


cdef inline Py_ssize_t _put_b64(uint8_t *o, Py_ssize_t w, const uint8_t *s, Py_ssize_t n) noexcept nogil:
    return w + <Py_ssize_t>tl_b64(o + w, s, n)


tl_b64_init()


def json_lines(bytes prefix, object data, const uint64_t[::1] seq, const uint64_t[::1] ts,
               const int64_t[::1] key_off, const int64_t[::1] key_len, const int64_t[::1] val_off,
               const int64_t[::1] val_len, bytearray out=None):
    """The dump's JSON line of every message, each `prefix` + seq + the rest, as one ASCII bytearray (`out`, resized,
    when given: a buffer reused keeps its memory); the same text as json.dumps of the record dict (tools/dump.py). A
    missing key (key_off -1) dumps as an empty key."""
    cdef const uint8_t[::1] view = data
    cdef Py_ssize_t size = view.shape[0]
    cdef const uint8_t *d = &view[0] if size else NULL
    cdef Py_ssize_t n = seq.shape[0], i, bound = 0, w = 0, kl, vl, plen = len(prefix)
    cdef const char *p = prefix
    for i in range(n):
        kl = key_len[i] if key_off[i] >= 0 else 0
        if key_off[i] >= 0 and (key_off[i] + kl > size or kl < 0):
            raise ValueError("key outside the data")
        if val_off[i] < 0 or val_len[i] < 0 or val_off[i] + val_len[i] > size:
            raise ValueError("value outside the data")
        # prefix, two u64s, the fixed text, and per field: text (escaped: up to 2x) + base64 (4 per 3 bytes)
        bound += plen + 40 + 80 + 2 * kl + 4 * (kl // 3 + 1) + 2 * val_len[i] + 4 * (val_len[i] // 3 + 1)
    if out is None:
        out = PyByteArray_FromStringAndSize(NULL, bound)  # not zeroed: every byte returned is written
    else:
        PyByteArray_Resize(out, bound)
    cdef uint8_t *o = <uint8_t *>PyByteArray_AS_STRING(out)
    cdef const uint8_t *k
    cdef const uint8_t *v
    with nogil:
        for i in range(n):
            if key_off[i] >= 0:
                k = d + key_off[i]
                kl = key_len[i]
            else:
                k = d
                kl = 0
            v = d + val_off[i]
            vl = val_len[i]
            w = _put(o, w, p, plen)
            w = _put_u64(o, w, seq[i])
            w = _put(o, w, ',"ts":', 6)
            w = _put_u64(o, w, ts[i])
            w = _put(o, w, ',"key":', 7)
            w = _put_text(o, w, k, kl)
            w = _put(o, w, ',"key_b64":"', 12)
            w = _put_b64(o, w, k, kl)
            w = _put(o, w, '","value":', 10)
            w = _put_text(o, w, v, vl)
            w = _put(o, w, ',"value_b64":"', 14)
            w = _put_b64(o, w, v, vl)
            w = _put(o, w, '"}\n', 3)
    PyByteArray_Resize(out, w)
    return out
