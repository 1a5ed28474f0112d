# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled core of the codec (docs/FORMAT.md §3): the bundle walk, the message decode, the message-set
encoder and the Arrow gather, with the same contract as the pure-Python code in `decode.py`, `bundle.py` and
`arrow.py` (`_codec.pyi` gives its types).

`tank_log.format.native` says whether the compiled modules run. Cython's own bounds checks are off, so every read is
checked by hand against the end of its bundle, message set or buffer. On malformed input the walk and the decode
stop and report ERROR: the pure-Python code then re-reads the bad bundle and raises the precise TankFormatError, so
both paths give the same errors, and the error messages live in one place.
"""

from cpython.buffer cimport PyBUF_WRITE
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.memoryview cimport PyMemoryView_FromMemory
from cpython.pyport cimport PY_SSIZE_T_MAX
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy, memmove, memset

cimport cython

import numpy as np

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    typedef unsigned __int128 tl_u128;  /* seq arithmetic that can reach 2**64 (§3.6) without wrapping */
    static inline tl_u128 tl_pow64(void) { return ((tl_u128)1) << 64; }
    static inline uint64_t tl_load_u64(const uint8_t *p) {
        uint64_t v;
        memcpy(&v, p, 8);
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap64(v);
    #endif
        return v;
    }
    static inline void tl_store_u64(uint8_t *p, uint64_t v) {
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap64(v);
    #endif
        memcpy(p, &v, 8);
    }
    static inline void tl_copy8(uint8_t *d, const uint8_t *s) {
        uint64_t v;
        memcpy(&v, s, 8);
        memcpy(d, &v, 8);
    }
    static inline void tl_copy16(uint8_t *d, const uint8_t *s) {
        uint64_t a, b;
        memcpy(&a, s, 8);
        memcpy(&b, s + 8, 8);
        memcpy(d, &a, 8);
        memcpy(d + 8, &b, 8);
    }
    /* Per tag byte (§3.4) of a copy: its length (bits 0-7), the high bits of its offset (8-10) and how many offset
       bytes follow (11-13), as Snappy's own decoder tabulates them; 0 for a literal's tag */
    static const uint16_t tl_snappy_tags[256] = {
        0x0000, 0x0804, 0x1001, 0x2001, 0x0000, 0x0805, 0x1002, 0x2002, 0x0000, 0x0806, 0x1003, 0x2003,
        0x0000, 0x0807, 0x1004, 0x2004, 0x0000, 0x0808, 0x1005, 0x2005, 0x0000, 0x0809, 0x1006, 0x2006,
        0x0000, 0x080a, 0x1007, 0x2007, 0x0000, 0x080b, 0x1008, 0x2008, 0x0000, 0x0904, 0x1009, 0x2009,
        0x0000, 0x0905, 0x100a, 0x200a, 0x0000, 0x0906, 0x100b, 0x200b, 0x0000, 0x0907, 0x100c, 0x200c,
        0x0000, 0x0908, 0x100d, 0x200d, 0x0000, 0x0909, 0x100e, 0x200e, 0x0000, 0x090a, 0x100f, 0x200f,
        0x0000, 0x090b, 0x1010, 0x2010, 0x0000, 0x0a04, 0x1011, 0x2011, 0x0000, 0x0a05, 0x1012, 0x2012,
        0x0000, 0x0a06, 0x1013, 0x2013, 0x0000, 0x0a07, 0x1014, 0x2014, 0x0000, 0x0a08, 0x1015, 0x2015,
        0x0000, 0x0a09, 0x1016, 0x2016, 0x0000, 0x0a0a, 0x1017, 0x2017, 0x0000, 0x0a0b, 0x1018, 0x2018,
        0x0000, 0x0b04, 0x1019, 0x2019, 0x0000, 0x0b05, 0x101a, 0x201a, 0x0000, 0x0b06, 0x101b, 0x201b,
        0x0000, 0x0b07, 0x101c, 0x201c, 0x0000, 0x0b08, 0x101d, 0x201d, 0x0000, 0x0b09, 0x101e, 0x201e,
        0x0000, 0x0b0a, 0x101f, 0x201f, 0x0000, 0x0b0b, 0x1020, 0x2020, 0x0000, 0x0c04, 0x1021, 0x2021,
        0x0000, 0x0c05, 0x1022, 0x2022, 0x0000, 0x0c06, 0x1023, 0x2023, 0x0000, 0x0c07, 0x1024, 0x2024,
        0x0000, 0x0c08, 0x1025, 0x2025, 0x0000, 0x0c09, 0x1026, 0x2026, 0x0000, 0x0c0a, 0x1027, 0x2027,
        0x0000, 0x0c0b, 0x1028, 0x2028, 0x0000, 0x0d04, 0x1029, 0x2029, 0x0000, 0x0d05, 0x102a, 0x202a,
        0x0000, 0x0d06, 0x102b, 0x202b, 0x0000, 0x0d07, 0x102c, 0x202c, 0x0000, 0x0d08, 0x102d, 0x202d,
        0x0000, 0x0d09, 0x102e, 0x202e, 0x0000, 0x0d0a, 0x102f, 0x202f, 0x0000, 0x0d0b, 0x1030, 0x2030,
        0x0000, 0x0e04, 0x1031, 0x2031, 0x0000, 0x0e05, 0x1032, 0x2032, 0x0000, 0x0e06, 0x1033, 0x2033,
        0x0000, 0x0e07, 0x1034, 0x2034, 0x0000, 0x0e08, 0x1035, 0x2035, 0x0000, 0x0e09, 0x1036, 0x2036,
        0x0000, 0x0e0a, 0x1037, 0x2037, 0x0000, 0x0e0b, 0x1038, 0x2038, 0x0000, 0x0f04, 0x1039, 0x2039,
        0x0000, 0x0f05, 0x103a, 0x203a, 0x0000, 0x0f06, 0x103b, 0x203b, 0x0000, 0x0f07, 0x103c, 0x203c,
        0x0000, 0x0f08, 0x103d, 0x203d, 0x0000, 0x0f09, 0x103e, 0x203e, 0x0000, 0x0f0a, 0x103f, 0x203f,
        0x0000, 0x0f0b, 0x1040, 0x2040
    };
    /* A raw Snappy block (§3.4) into dst[0:dlen]: 0, or -1 when it is malformed or does not make exactly dlen bytes
       (the blocks cramjam rejects too: the pure walk then names the error). Every read is checked against the end
       of the block and every write against dlen. Away from the end of dst, literals of up to 16 bytes move as 16
       and copies in words of 8 or 16, overshooting by less than 16 bytes into what the next elements overwrite; a
       copy from fewer than 8 bytes back (a repeated short pattern) first doubles its distance, as Snappy's own
       decoder does. Near the end of dst everything is copied exactly. */
    static int tl_snappy_raw(const uint8_t *ip, size_t n, uint8_t *dst, size_t dlen) {
        const uint8_t *ie = ip + n, *from;
        uint8_t *op = dst, *oe = dst + dlen, *end, c;
        uint64_t claim = 0;
        size_t len, off, nb, i;
        uint32_t word, entry;
        int shift = 0;
        do {  /* the uncompressed length: the walk has read it as dlen */
            if (ip >= ie || shift > 35) return -1;
            c = *ip++;
            claim |= (uint64_t)(c & 0x7f) << shift;
            shift += 7;
        } while (c & 0x80);
        if (claim != dlen) return -1;
        while (ip < ie) {
            c = *ip++;
            if ((c & 3) == 0) {  /* a literal */
                len = (size_t)(c >> 2) + 1;
                if (len <= 16 && ie - ip >= 16 && oe - op >= 16) {  /* the common short literal */
                    tl_copy16(op, ip);
                    ip += len;
                    op += len;
                    continue;
                }
                if (len > 60) {  /* 1 to 4 bytes of length - 1 follow */
                    nb = len - 60;
                    if ((size_t)(ie - ip) < nb) return -1;
                    for (len = 0, i = 0; i < nb; i++) len |= (size_t)ip[i] << (8 * i);
                    ip += nb;
                    len += 1;
                }
                if ((size_t)(ie - ip) < len || (size_t)(oe - op) < len) return -1;
                memcpy(op, ip, len);
                ip += len;
                op += len;
                continue;
            }
            if (ie - ip >= 4) {  /* a copy (§3.4) away from the end of the block: one path for the three kinds */
                entry = tl_snappy_tags[c];
                nb = entry >> 11;
                memcpy(&word, ip, 4);
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
                word = __builtin_bswap32(word);
    #endif
                len = entry & 0xff;
                off = (entry & 0x700) + (word & (uint32_t)(((uint64_t)1 << (8 * nb)) - 1));
                ip += nb;
            } else switch (c & 3) {
            case 1:
                if (ip >= ie) return -1;
                len = 4 + ((c >> 2) & 7);
                off = ((size_t)(c >> 5) << 8) | *ip++;
                break;
            case 2:
                if (ie - ip < 2) return -1;
                len = 1 + (size_t)(c >> 2);
                off = (size_t)ip[0] | ((size_t)ip[1] << 8);
                ip += 2;
                break;
            default:
                return -1;  /* a copy with a 4-byte offset needs 4 more bytes */
            }
            if (off == 0 || off > (size_t)(op - dst) || len > (size_t)(oe - op)) return -1;
            from = op - off;
            if (len <= 16 && off >= 8 && oe - op >= 16) {  /* the common short copy: the second word may read the
                                                              first one's bytes, which are already right */
                tl_copy8(op, from);
                tl_copy8(op + 8, from + 8);
                op += len;
                continue;
            }
            end = op + len;
            if ((size_t)(oe - op) >= len + 16) {
                while ((size_t)(op - from) < 8 && op < end) op += (tl_copy8(op, from), (size_t)(op - from));
                if ((size_t)(op - from) >= 16)
                    for (; op < end; op += 16, from += 16) tl_copy16(op, from);
                else
                    for (; op < end; op += 8, from += 8) tl_copy8(op, from);
            } else if (off >= len) {
                memcpy(op, from, len);
            } else {
                for (i = 0; i < len; i++) op[i] = from[i];
            }
            op = end;
        }
        return op == oe ? 0 : -1;
    }
    """
    ctypedef unsigned long long tl_u128  # really unsigned __int128: never converted to a Python int implicitly
    tl_u128 tl_pow64() noexcept nogil
    uint64_t tl_load_u64(const uint8_t *p) noexcept nogil
    void tl_store_u64(uint8_t *p, uint64_t v) noexcept nogil
    int tl_snappy_raw(const uint8_t *ip, size_t n, uint8_t *dst, size_t dlen) noexcept nogil


cdef enum:
    # walk stop reasons, in the order of decode.REASONS
    R_COMPLETE = 0
    R_INCOMPLETE = 1
    R_ZERO = 2
    R_LIMIT = 3
    R_BUDGET = 4
    R_ERROR = 5
    # bundle flags (§3.3) and message flags (§3.5): the same values as bundle.py
    RESERVED = 0x80
    SIMPLE_MASK = 0xC2
    HAVE_KEY = 0x01
    USE_LAST_TS = 0x02
    SEQ_PREV_PLUS_ONE = 0x04
    UNKNOWN_MESSAGE_FLAGS = 0xF8
    MIN_MESSAGE_BYTES = 2
    # Raw Snappy blocks of up to this many bytes are decoded by tl_snappy_raw (codecs.BlockCodec.raw_snappy), larger
    # ones by the codec's decompress_into: a call costs ~0.45 µs, while cramjam's decoder is ~1.5 % faster per byte,
    # which only outweighs the call on blocks of ~45 KB and more (bench/RESULTS.md, "Scan into Arrow")
    SNAPPY_HERE_MAX = 65536

cdef uint64_t U32_MAX = 0xFFFFFFFF



cdef inline int read_varint(const uint8_t *b, Py_ssize_t p, Py_ssize_t end, uint32_t *out, Py_ssize_t *after) noexcept nogil:
    """§3.2: 0 = ok, 1 = runs past `end`, 2 = longer than 5 bytes or above 2**32-1."""
    cdef uint32_t result = 0
    cdef int shift = 0
    cdef uint8_t byte
    while True:
        if p >= end:
            return 1
        byte = b[p]
        p += 1
        if shift == 28:
            if byte > 0x0F:
                return 2
            out[0] = result | (<uint32_t>byte << 28)
            after[0] = p
            return 0
        result |= (<uint32_t>(byte & 0x7F)) << shift
        if byte < 0x80:
            out[0] = result
            after[0] = p
            return 0
        shift += 7


cdef tl_u128 to_u128(object v):
    """A Python int in 0..2**64 (larger values clamp to 2**64 + 1, negative ones to 0)."""
    if v < 0:
        return 0
    if v > (1 << 64):
        return tl_pow64() + 1
    if v == (1 << 64):
        return tl_pow64()
    return <uint64_t>v


cdef object from_u128(tl_u128 v):
    if v >= tl_pow64():
        return (1 << 64) + <uint64_t>(v - tl_pow64())
    return <uint64_t>v


cdef struct Row:
    int64_t off
    int64_t end
    int64_t set_off
    int64_t set_len  # uncompressed (with collect)
    int64_t count
    uint64_t first
    uint64_t last
    uint8_t flags


cdef inline bint _bad_claim(const uint8_t *b, Py_ssize_t q, Py_ssize_t end, uint64_t count, uint64_t max_exp,
                            uint32_t *claim) noexcept nogil:
    """Read the uncompressed length a Snappy block at [q, end) claims into *claim; True when it is unreadable, more
    than the block can expand to, or too small for `count` messages (checked before anything is allocated)."""
    cdef Py_ssize_t after = 0
    if q == end or read_varint(b, q, end, claim, &after):
        return True
    return claim[0] > max_exp * <uint64_t>(end - q) + 64 or count > claim[0] // MIN_MESSAGE_BYTES


def walk(object data, Py_ssize_t start, object next_seq, bint collect, object max_bytes, object stop_seq,
         Py_ssize_t max_messages, tuple codecs):
    """Walk framed bundles from `start` like decode._walk. `codecs[i]` is None or (decompress_into, max_expansion,
    raw_snappy) for codec id i (`tl_snappy_raw` decodes raw Snappy blocks without calling decompress_into). Returns (columns, gathered, stop, next_seq, reason, need), `gathered` being (data, set_starts,
    set_ends) with `collect`; with R_ERROR, `stop` and `next_seq` are the bad bundle's offset and the counter before
    it. With `collect`, the message sets are written straight into one buffer: Snappy blocks (the only codec, §3.4)
    are sized from their length header, then decompressed into their place."""
    cdef const uint8_t[::1] view = data
    cdef Py_ssize_t n = view.shape[0]
    cdef const uint8_t *b = &view[0] if n else NULL
    cdef Py_ssize_t pos = start, limit, hp = 0, end = 0, q = 0, need = 0, collected = 0
    cdef tl_u128 nxt = to_u128(next_seq), stop_at, first = 0, last = 0, after, two64 = tl_pow64()
    cdef uint32_t v32 = 0
    cdef uint64_t c, max_exp
    cdef uint8_t f, codec
    cdef int reason = R_COMPLETE
    cdef Py_ssize_t nrows = 0, cap = 64
    cdef Row *rows = <Row *>PyMem_Malloc(cap * sizeof(Row))
    cdef Row *grown
    cdef object mv = memoryview(data)
    cdef object spec
    cdef object gathered = None
    cdef uint32_t claim = 0
    if rows == NULL:
        raise MemoryError()
    try:
        limit = n if max_bytes is None else min(n, start + max_bytes)
        if stop_seq is None:
            stop_at = two64 + 1
        else:
            stop_at = to_u128(stop_seq)
        while pos < n:
            if b[pos] < 0x80:
                v32 = b[pos]
                hp = pos + 1
            elif read_varint(b, pos, n, &v32, &hp):
                reason = R_INCOMPLETE if n - pos < 5 and _all_continued(b, pos, n) else R_ERROR
                break
            if v32 == 0:
                reason = R_ZERO
                break
            end = hp + v32
            if end > n:
                reason, need = R_INCOMPLETE, end
                break
            f = b[hp]
            c = (f >> 2) & 0x0F
            codec = f & 0x03
            q = hp + 1
            if f & SIMPLE_MASK == 0 and c:  # plain/Snappy, not sparse, count in the flags
                first = nxt
                if nxt + c > two64:
                    reason = R_ERROR
                    break
                last = nxt + c - 1
            else:
                if f & RESERVED:
                    reason = R_ERROR
                    break
                if codec and codecs[codec] is None:
                    reason = R_ERROR
                    break
                if not c:
                    if read_varint(b, q, end, &v32, &q) or v32 == 0:
                        reason = R_ERROR
                        break
                    c = v32
                if f & SPARSE:
                    if q + 8 > end:
                        reason = R_ERROR
                        break
                    first = tl_load_u64(b + q)
                    q += 8
                    if first == 0 or first < nxt:
                        reason = R_ERROR
                        break
                    if c != 1:
                        if read_varint(b, q, end, &v32, &q):
                            reason = R_ERROR
                            break
                        last = first + v32 + 1
                    else:
                        last = first
                else:
                    first = nxt
                    last = nxt + c - 1
                if last >= two64:
                    reason = R_ERROR
                    break
            if f & SPARSE:  # (no conditional expression: Cython would hold it in a 64-bit temporary)
                after = last + 1
            else:
                after = first + c
            if codec:
                spec = codecs[codec]
                max_exp = spec[1]
                if c > (max_exp * <uint64_t>(end - q) + 64) // MIN_MESSAGE_BYTES:
                    reason = R_ERROR
                    break
                if collect and _bad_claim(b, q, end, c, max_exp, &claim):
                    reason = R_ERROR
                    break
            elif c > <uint64_t>(end - q) // MIN_MESSAGE_BYTES:
                reason = R_ERROR
                break
            if nrows == cap:
                cap *= 2
                grown = <Row *>PyMem_Realloc(rows, cap * sizeof(Row))
                if grown == NULL:
                    raise MemoryError()
                rows = grown
            rows[nrows].off = pos
            rows[nrows].end = end
            rows[nrows].set_off = q
            rows[nrows].set_len = claim if codec else end - q
            rows[nrows].count = <int64_t>c
            rows[nrows].first = <uint64_t>first
            rows[nrows].last = <uint64_t>(after - 1)
            rows[nrows].flags = f
            nrows += 1
            nxt = after
            pos = end
            if nxt > stop_at or pos >= limit:
                reason = R_LIMIT if pos < n else R_COMPLETE
                break
            collected += c
            if collected >= max_messages and pos < n:
                reason = R_BUDGET
                break
        if collect:  # also before a bad header: a block before it that does not decompress is the first error
            gathered = _gather(rows, &nrows, b, mv, codecs)
            if gathered is None:  # the error is at row nrows
                pos = rows[nrows].off
                nxt = to_u128(next_seq) if nrows == 0 else <tl_u128>rows[nrows - 1].last + 1
                reason = R_ERROR
        offsets = np.empty(nrows, np.int64)
        ends = np.empty(nrows, np.int64)
        set_offsets = np.empty(nrows, np.int64)
        flags = np.empty(nrows, np.uint8)
        counts = np.empty(nrows, np.int64)
        firsts = np.empty(nrows, np.uint64)
        lasts = np.empty(nrows, np.uint64)
        _fill_rows(rows, nrows, offsets, ends, set_offsets, flags, counts, firsts, lasts)
    finally:
        PyMem_Free(rows)
    columns = (offsets, ends, set_offsets, flags, counts, firsts, lasts)
    return columns, gathered, pos, from_u128(nxt), reason, need


cdef object _gather(Row *rows, Py_ssize_t *nrows, const uint8_t *b, object mv, tuple codecs):
    """(data, set_starts, set_ends) of the rows' message sets, one after another in one bytes object, then PAD
    zero bytes (plain sets only: the walked bundles copied whole, as decode._walk does). None when a block does not
    decompress to its claimed length; *nrows is then that row's index."""
    cdef Py_ssize_t i, n = nrows[0], total = 0, at = 0, ln, lo
    cdef bint packed = False
    for i in range(n):
        total += rows[i].set_len
        packed |= (rows[i].flags & 0x03) != 0
    starts = np.empty(n, np.int64)
    ends = np.empty(n, np.int64)
    cdef int64_t[::1] st = starts
    cdef int64_t[::1] en = ends
    if not packed and n:  # plain sets only: one copy of the walked bundles, the sets located inside it
        lo = rows[0].off
        total = rows[n - 1].end - lo
        out = PyBytes_FromStringAndSize(NULL, total + PAD)
        memcpy(PyBytes_AS_STRING(out), b + lo, total)
        memset(PyBytes_AS_STRING(out) + total, 0, PAD)
        for i in range(n):
            st[i] = rows[i].set_off - lo
            en[i] = rows[i].end - lo
        return out, starts, ends
    out = PyBytes_FromStringAndSize(NULL, total + PAD)
    cdef char *o = PyBytes_AS_STRING(out)
    memset(o + total, 0, PAD)
    cdef object dst = PyMemoryView_FromMemory(o, total + PAD, PyBUF_WRITE)  # the new bytes is ours until returned
    for i in range(n):
        ln = rows[i].set_len
        st[i] = at
        if unpack_set(b, rows[i].set_off, rows[i].end, rows[i].flags, ln, codecs, mv, <uint8_t *>o, at, dst):
            nrows[0] = i
            return None
        at += ln
        en[i] = at
    return out, starts, ends


cdef int set_length(const uint8_t *b, Py_ssize_t set_off, Py_ssize_t end, uint8_t flags, int64_t count,
                    tuple codecs, Py_ssize_t *length) except -1:
    """The uncompressed length of a walked bundle's message set at [set_off, end) of b into *length; 1 when its
    codec is not in `codecs` or its Snappy block claims an impossible length (checked before anything is
    allocated)."""
    cdef uint8_t codec = flags & 0x03
    cdef uint32_t claim = 0
    if not codec:
        length[0] = end - set_off
        return 0
    if codecs[codec] is None or _bad_claim(b, set_off, end, count, codecs[codec][1], &claim):
        return 1
    length[0] = claim
    return 0


cdef int unpack_set(const uint8_t *b, Py_ssize_t set_off, Py_ssize_t end, uint8_t flags, Py_ssize_t length,
                    tuple codecs, object src, uint8_t *out, Py_ssize_t at, object out_view) except -1:
    """A walked bundle's message set at [set_off, end) of b into out[at:at + length]: copied, or decompressed to
    exactly `length` bytes (`set_length`); 1 when it does not decompress to that. `src` is a memoryview of b and
    `out_view` a writable one of out, for a codec's decompress_into."""
    cdef uint8_t codec = flags & 0x03
    cdef uint8_t *dst = out + at
    if codec == 0:
        memcpy(dst, b + set_off, length)
        return 0
    if codecs[codec][2] and length <= SNAPPY_HERE_MAX:  # a raw Snappy block of at most 64 KiB is decoded here,
        # holding the GIL on purpose: it takes < 40 µs, less than releasing and taking it back is worth
        return 1 if tl_snappy_raw(b + set_off, end - set_off, dst, length) else 0
    try:
        written = codecs[codec][0](src[set_off:end], out_view[at:at + length])
    except Exception:  # the pure walk re-raises it as a TankFormatError at this bundle
        written = -1
    return 0 if written == length else 1


def snappy_raw_into(const uint8_t[::1] block, uint8_t[::1] out) -> bool:
    """Decode one raw Snappy block into all of `out` with the walk's decoder (`tl_snappy_raw`); True when the block
    is well formed and makes exactly len(out) bytes. For tests against cramjam."""
    cdef Py_ssize_t n = block.shape[0], m = out.shape[0]
    cdef const uint8_t *src = &block[0] if n else NULL
    cdef uint8_t *dst = &out[0] if m else NULL
    cdef uint8_t empty = 0
    if src == NULL:
        src = &empty
    if dst == NULL:
        dst = &empty
    with nogil:
        rc = tl_snappy_raw(src, n, dst, m)
    return rc == 0


cdef bint _all_continued(const uint8_t *b, Py_ssize_t p, Py_ssize_t n) noexcept nogil:
    while p < n:
        if b[p] < 0x80:
            return False
        p += 1
    return True


cdef void _fill_rows(Row *rows, Py_ssize_t nrows, int64_t[::1] offsets, int64_t[::1] ends, int64_t[::1] set_offsets,
                     uint8_t[::1] flags, int64_t[::1] counts, uint64_t[::1] firsts, uint64_t[::1] lasts) noexcept:
    cdef Py_ssize_t i
    for i in range(nrows):
        offsets[i] = rows[i].off
        ends[i] = rows[i].end
        set_offsets[i] = rows[i].set_off
        flags[i] = rows[i].flags
        counts[i] = rows[i].count
        firsts[i] = rows[i].first
        lasts[i] = rows[i].last


def collect(object data, const int64_t[::1] offsets, const int64_t[::1] ends, const int64_t[::1] set_offsets,
            const uint8_t[::1] flags, const int64_t[::1] counts, tuple codecs):
    """The message sets of already walked bundles (a headers-only walk's columns, any subset in order) gathered as
    `walk` gathers them with `collect`: (data, set_starts, set_ends), or the index of the first bundle whose Snappy
    block has an impossible claim or does not decompress to it (decode.collect_bundles then names the error)."""
    cdef const uint8_t[::1] view = data
    cdef Py_ssize_t n = counts.shape[0], size = view.shape[0], i
    cdef const uint8_t *b = &view[0] if size else NULL
    cdef Py_ssize_t length = 0
    cdef Row *rows = <Row *>PyMem_Malloc((n + 1) * sizeof(Row))
    if rows == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            if not 0 <= offsets[i] <= set_offsets[i] <= ends[i] <= size:
                return i
            rows[i].off = offsets[i]
            rows[i].end = ends[i]
            rows[i].set_off = set_offsets[i]
            rows[i].count = counts[i]
            rows[i].flags = flags[i]
            if set_length(b, set_offsets[i], ends[i], flags[i], counts[i], codecs, &length):
                return i
            rows[i].set_len = length
        gathered = _gather(rows, &n, b, memoryview(data), codecs)
        return n if gathered is None else gathered
    finally:
        PyMem_Free(rows)


# ---------------------------------------------------------------------------------------------------------------
# messages


def decode(object data, const int64_t[::1] set_starts, const int64_t[::1] set_ends, const int64_t[::1] counts,
           const uint8_t[::1] bundle_flags, const uint64_t[::1] firsts, const uint64_t[::1] lasts):
    """Decode every message of the collected bundles (§3.5, seqs per §3.6) like decode._decode_pure. Returns
    (seq, ts, key_off, key_len, val_off, val_len, bundle), or None when a message set is malformed (the pure
    decoder then names the error). `data` ends with PAD bytes of padding after the last message set (`parse_set`)."""
    cdef const uint8_t[::1] view = data
    cdef Py_ssize_t size = view.shape[0]
    cdef const uint8_t *buf = &view[0] if size else NULL
    cdef Py_ssize_t nb = counts.shape[0], b, total = 0, out = 0, p, end
    cdef int64_t i, n
    cdef bint bad = False
    for b in range(nb):
        if counts[b] < 0 or counts[b] > PY_SSIZE_T_MAX - total:
            return None
        total += counts[b]
    seq_a = np.empty(total, np.uint64)
    ts_a = np.empty(total, np.uint64)
    koff_a = np.empty(total, np.int64)
    klen_a = np.empty(total, np.int64)
    voff_a = np.empty(total, np.int64)
    vlen_a = np.empty(total, np.int64)
    bundle_a = np.empty(total, np.int64)
    cdef uint64_t[::1] seq_o = seq_a, ts_o = ts_a
    cdef int64_t[::1] koff_o = koff_a, klen_o = klen_a, voff_o = voff_a, vlen_o = vlen_a, bundle_o = bundle_a
    with nogil:
        for b in range(nb):
            p = set_starts[b]
            end = set_ends[b]
            n = counts[b]
            if p < 0 or p > end or end > size - PAD or n > total - out:
                bad = True
                break
            if parse_set(buf, p, end, n, (bundle_flags[b] & SPARSE) != 0, firsts[b], lasts[b], &seq_o[out],
                         &ts_o[out], &koff_o[out], &klen_o[out], &voff_o[out], &vlen_o[out]):
                bad = True
                break
            for i in range(n):
                bundle_o[out + i] = b
            out += n
    if bad:
        return None
    return seq_a, ts_a, koff_a, klen_a, voff_a, vlen_a, bundle_a


cdef int parse_set(const uint8_t *buf, Py_ssize_t p, Py_ssize_t end, int64_t n, bint sparse, uint64_t first,
                   uint64_t last, uint64_t *seq_o, uint64_t *ts_o, int64_t *koff_o, int64_t *klen_o,
                   int64_t *voff_o, int64_t *vlen_o) noexcept nogil:
    """The n messages of the message set at [p, end) of buf (§3.5; seqs per §3.6 from the bundle's first and last)
    into the columns' rows 0..n-1 (key_off -1 and key_len 0 for a keyless message; offsets into buf). 1 when the set
    is malformed. buf holds PAD readable bytes after `end`: a message's fields are read before its end is checked, as
    the pure decoder does."""
    cdef int64_t i
    cdef uint64_t seq = 0, prev_seq = first, ts, prev_ts = 0
    cdef uint32_t delta = 0, vlen = 0
    cdef uint8_t f, kl
    for i in range(n):
        if p >= end:  # message count exceeds the messages in the set
            return 1
        f = buf[p]
        if f & UNKNOWN_MESSAGE_FLAGS:
            return 1
        p += 1
        if i == 0:
            seq = first
        else:
            seq = prev_seq + 1
            if sparse and i == n - 1:
                seq = last
                if last <= prev_seq:
                    return 1
            elif sparse:
                if not f & SEQ_PREV_PLUS_ONE:
                    if read_varint(buf, p, p + 5, &delta, &p):
                        return 1
                    seq = seq + delta
                if seq >= last or seq <= prev_seq:
                    return 1
        if f & USE_LAST_TS:
            ts = prev_ts if i else 0
        else:
            ts = tl_load_u64(buf + p)
            p += 8
        koff_o[i] = -1
        klen_o[i] = 0
        if f & HAVE_KEY:
            kl = buf[p]
            if kl:
                koff_o[i] = p + 1
                klen_o[i] = kl
            p += 1 + kl
        if read_varint(buf, p, p + 5, &vlen, &p):
            return 1
        voff_o[i] = p
        vlen_o[i] = vlen
        p += vlen
        if p > end:  # message runs past the end of its message set
            return 1
        seq_o[i] = seq
        ts_o[i] = ts
        prev_seq = seq
        prev_ts = ts
    return 1 if p != end else 0  # p != end: bytes left over


# ---------------------------------------------------------------------------------------------------------------
# encoding


def encode_message_set(object messages, bint sparse):
    """bundle.encode_message_set's output for a sequence of Message tuples; returns None for input the pure
    encoder rejects (it then raises the ValueError)."""
    cdef Py_ssize_t count = len(messages), i, size = 0, klen, vlen
    cdef object m, key, value
    cdef object prev_seq_o = -1
    cdef uint64_t ts, prev_ts = 0, gap
    # first pass: validate and size
    for i in range(count):
        m = messages[i]
        key = m[2]
        value = m[3]
        klen = len(key) if key else 0
        if klen > 255:
            return None
        vlen = len(value)
        if vlen > U32_MAX:
            return None
        size += 1 + 8 + 5 + 1 + klen + 5 + vlen
    if count == 0:
        return b""
    out = bytearray(size)
    cdef uint8_t[::1] o = out
    cdef Py_ssize_t w = 0
    cdef const uint8_t[::1] kv
    cdef const uint8_t[::1] vv
    cdef uint8_t flags
    cdef object seq_o, step
    for i in range(count):
        m = messages[i]
        seq_o = m[0]
        ts = m[1]
        key = m[2]
        value = m[3]
        flags = 0
        if key:
            flags = HAVE_KEY
        if i and ts == prev_ts:
            flags |= USE_LAST_TS
        gap = 0
        if sparse and 0 < i < count - 1:
            step = seq_o - prev_seq_o - 1
            if step == 0:
                flags |= SEQ_PREV_PLUS_ONE
            elif 0 < step <= U32_MAX:
                gap = step
            else:
                return None
        o[w] = flags
        w += 1
        if gap:
            w = _put_varint(&o[0], w, <uint32_t>gap)
        if not flags & USE_LAST_TS:
            tl_store_u64(&o[w], ts)
            w += 8
        if key:
            kv = key
            o[w] = <uint8_t>kv.shape[0]
            w += 1
            memcpy(&o[w], &kv[0], kv.shape[0])
            w += kv.shape[0]
        vv = value
        w = _put_varint(&o[0], w, <uint32_t>vv.shape[0])
        if vv.shape[0]:
            memcpy(&o[w], &vv[0], vv.shape[0])
            w += vv.shape[0]
        prev_seq_o = seq_o
        prev_ts = ts
    return PyBytes_FromStringAndSize(<char *>&o[0], w)


def encode_columns(object data, const uint64_t[::1] seq, const uint64_t[::1] ts, const int64_t[::1] key_off,
                   const int64_t[::1] key_len, const int64_t[::1] val_off, const int64_t[::1] val_len, bint sparse):
    """encode_message_set's output for messages given as columns over `data` (messages.MessageColumns); None for
    input the pure encoder rejects or rows outside `data` (the caller then encodes on the pure path, which raises)."""
    cdef const uint8_t[::1] d = data
    cdef Py_ssize_t count = seq.shape[0], size, payload = 0
    if ts.shape[0] != count or key_off.shape[0] != count or key_len.shape[0] != count \
            or val_off.shape[0] != count or val_len.shape[0] != count:
        return None
    if count == 0:
        return b""
    cdef Columns c = _columns(d, seq, ts, key_off, key_len, val_off, val_len)
    size = _rows_bound(&c, 0, count, sparse, &payload)
    if size < 0:
        return None
    out = PyBytes_FromStringAndSize(NULL, size)
    return out[:_encode_rows(&c, 0, count, sparse, <uint8_t *>PyBytes_AS_STRING(out))]


def encode_bundles(object data, const uint64_t[::1] seq, const uint64_t[::1] ts, const int64_t[::1] key_off,
                   const int64_t[::1] key_len, const int64_t[::1] val_off, const int64_t[::1] val_len,
                   const int64_t[::1] bounds, uint64_t expected, int snappy, object compress):
    """The framed bundles (§3.1, §3.3) of rows [bounds[k], bounds[k + 1]) for each k, one after another, as
    `frame(encode_bundle_columns(...))` gives each: (bytes, int64 array of each bundle's end in them); None for rows
    the pure encoder rejects (it then raises).

    A bundle is non-sparse when it continues the counter (§3.6): its first seq is `expected` (0: the first bundle
    starts the segment) or the previous bundle's last + 1, and its seqs are consecutive. `snappy`: the SnappyPolicy
    (0 never, 1 client, 2 always, 3 when smaller, bundle.choose_codec's rules); `compress`: the Snappy block
    compressor, called with the message set's bytes.
    """
    cdef const uint8_t[::1] d = data
    cdef Py_ssize_t count = seq.shape[0], nb = bounds.shape[0] - 1, k, lo, hi, n, bound, set_len, payload, hlen
    cdef Py_ssize_t w = 0, cap = 0, pay_len
    cdef uint64_t first, last
    cdef uint8_t flags, codec
    cdef bint sparse
    cdef uint8_t header[32]
    cdef const uint8_t *pay
    cdef const uint8_t[::1] packed_view
    cdef object packed
    if ts.shape[0] != count or key_off.shape[0] != count or key_len.shape[0] != count \
            or val_off.shape[0] != count or val_len.shape[0] != count or nb < 0:
        return None
    cdef Columns c = _columns(d, seq, ts, key_off, key_len, val_off, val_len)
    for k in range(nb):  # validate and size every bundle first: no output for input the pure encoder rejects
        lo, hi = bounds[k], bounds[k + 1]
        if lo < 0 or hi > count or hi <= lo or seq[lo] < 1 or seq[hi - 1] < seq[lo]:
            return None
        sparse = _sparse(c.seq, lo, hi, expected if k == 0 else seq[lo - 1] + 1)
        if sparse and hi - lo > 1 and seq[hi - 1] - seq[lo] - 1 > U32_MAX:
            return None
        bound = _rows_bound(&c, lo, hi, sparse, &payload)
        if bound < 0:
            return None
        cap = max(cap, bound)
    ends = np.empty(nb, dtype=np.int64)
    cdef int64_t[::1] ends_v = ends
    cdef uint8_t *scratch = <uint8_t *>PyMem_Malloc(cap + 1)
    cdef uint8_t *out = NULL
    cdef uint8_t *grown
    cdef Py_ssize_t out_cap = 0
    if scratch == NULL:
        raise MemoryError()
    try:
        for k in range(nb):
            lo, hi = bounds[k], bounds[k + 1]
            n = hi - lo
            first, last = seq[lo], seq[hi - 1]
            sparse = _sparse(c.seq, lo, hi, expected if k == 0 else seq[lo - 1] + 1)
            _rows_bound(&c, lo, hi, sparse, &payload)
            set_len = _encode_rows(&c, lo, hi, sparse, scratch)
            codec = 0
            pay, pay_len = scratch, set_len
            if snappy == 2 or (snappy == 1 and (n > 512 or payload > 1024)) or (snappy == 3 and set_len > 1024):
                packed = compress(PyBytes_FromStringAndSize(<char *>scratch, set_len))
                packed_view = packed
                if snappy != 3 or packed_view.shape[0] < set_len:
                    codec = 1
                    pay, pay_len = &packed_view[0] if packed_view.shape[0] else scratch, packed_view.shape[0]
            flags = codec | (SPARSE if sparse else 0) | (<uint8_t>(n << 2) if n < 16 else 0)
            header[0] = flags
            hlen = 1
            if n >= 16:
                hlen = _put_varint(header, hlen, <uint32_t>n)
            if sparse:
                tl_store_u64(&header[hlen], first)
                hlen += 8
                if n != 1:
                    hlen = _put_varint(header, hlen, <uint32_t>(last - first - 1))
            if w + 5 + hlen + pay_len > out_cap:
                out_cap = max(2 * out_cap, w + 5 + hlen + pay_len + (64 << 10))
                grown = <uint8_t *>PyMem_Realloc(out, out_cap)
                if grown == NULL:
                    raise MemoryError()
                out = grown
            w = _put_varint(out, w, <uint32_t>(hlen + pay_len))
            memcpy(out + w, header, hlen)
            w += hlen
            memcpy(out + w, pay, pay_len)
            w += pay_len
            ends_v[k] = w
        return PyBytes_FromStringAndSize(<char *>out, w), ends
    finally:
        PyMem_Free(scratch)
        PyMem_Free(out)


cdef struct Columns:
    const uint8_t *data
    Py_ssize_t size
    const uint64_t *seq
    const uint64_t *ts
    const int64_t *key_off
    const int64_t *key_len
    const int64_t *val_off
    const int64_t *val_len


cdef Columns _columns(const uint8_t[::1] d, const uint64_t[::1] seq, const uint64_t[::1] ts,
                      const int64_t[::1] key_off, const int64_t[::1] key_len, const int64_t[::1] val_off,
                      const int64_t[::1] val_len):
    cdef Columns c
    c.size = d.shape[0]
    c.data = &d[0] if c.size else NULL
    c.seq, c.ts = &seq[0] if seq.shape[0] else NULL, &ts[0] if ts.shape[0] else NULL
    c.key_off, c.key_len = &key_off[0] if key_off.shape[0] else NULL, &key_len[0] if key_len.shape[0] else NULL
    c.val_off, c.val_len = &val_off[0] if val_off.shape[0] else NULL, &val_len[0] if val_len.shape[0] else NULL
    return c


cdef inline bint _sparse(const uint64_t *seq, Py_ssize_t lo, Py_ssize_t hi, uint64_t expected) noexcept nogil:
    """Whether rows [lo, hi) need a sparse bundle: they do not carry expected, expected + 1, ... (0: seq[lo])."""
    if expected == 0:
        expected = seq[lo]
    return not (seq[lo] == expected and seq[hi - 1] - seq[lo] == <uint64_t>(hi - lo - 1))


cdef Py_ssize_t _rows_bound(const Columns *c, Py_ssize_t lo, Py_ssize_t hi, bint sparse,
                            Py_ssize_t *payload) noexcept nogil:
    """An upper bound of the message set of rows [lo, hi) (and Σ key + value into `payload`); -1 for rows the pure
    encoder rejects (a key over 255 bytes, a seq gap of 2**32 or more, a value over u32) or outside the data."""
    cdef Py_ssize_t i, size = 0, pay = 0
    cdef int64_t ko, kl, vo, vl
    for i in range(lo, hi):
        ko, kl, vo, vl = c.key_off[i], c.key_len[i], c.val_off[i], c.val_len[i]
        if ko >= 0 and (kl < 0 or kl > 255 or ko > c.size - kl):
            return -1
        if vo < 0 or vl < 0 or <uint64_t>vl > U32_MAX or vo > c.size - vl:
            return -1
        if sparse and lo < i < hi - 1 and (c.seq[i] <= c.seq[i - 1] or c.seq[i] - c.seq[i - 1] - 1 > U32_MAX):
            return -1
        pay += (kl if ko >= 0 else 0) + vl
        size += 1 + 5 + 8 + 1 + (kl if ko >= 0 else 0) + 5 + vl
    payload[0] = pay
    return size


cdef Py_ssize_t _encode_rows(const Columns *c, Py_ssize_t lo, Py_ssize_t hi, bint sparse, uint8_t *o) noexcept nogil:
    """Encode rows [lo, hi) (checked by _rows_bound) as a message set into `o` (§3.5, the writers' conventions of
    encode_message_set); returns its length."""
    cdef Py_ssize_t i, w = 0
    cdef int64_t ko, kl, vo, vl
    cdef uint64_t prev_ts = 0, gap
    cdef uint8_t flags
    for i in range(lo, hi):
        ko, kl, vo, vl = c.key_off[i], c.key_len[i], c.val_off[i], c.val_len[i]
        flags = HAVE_KEY if ko >= 0 and kl > 0 else 0
        if i > lo and c.ts[i] == prev_ts:
            flags |= USE_LAST_TS
        gap = 0
        if sparse and lo < i < hi - 1:
            gap = c.seq[i] - c.seq[i - 1] - 1
            if gap == 0:
                flags |= SEQ_PREV_PLUS_ONE
        o[w] = flags
        w += 1
        if gap:
            w = _put_varint(o, w, <uint32_t>gap)
        if not flags & USE_LAST_TS:
            tl_store_u64(&o[w], c.ts[i])
            w += 8
        if flags & HAVE_KEY:
            o[w] = <uint8_t>kl
            w += 1
            memcpy(&o[w], &c.data[ko], kl)
            w += kl
        w = _put_varint(o, w, <uint32_t>vl)
        if vl:
            memcpy(&o[w], &c.data[vo], vl)
            w += vl
        prev_ts = c.ts[i]
    return w


cdef inline Py_ssize_t _put_varint(uint8_t *o, Py_ssize_t w, uint32_t v) noexcept nogil:
    while v >= 0x80:
        o[w] = (v & 0x7F) | 0x80
        v >>= 7
        w += 1
    o[w] = v
    return w + 1


# ---------------------------------------------------------------------------------------------------------------
# Arrow (`arrow.py`)

def gather_spans(object data, const int64_t[::1] off, const int64_t[::1] length):
    """The bytes at [off[i], off[i] + length[i]) of `data`, one after another, with the n + 1 int32 offsets of an
    Arrow binary array over them; None when a span lies outside `data` or they need more than int32 offsets."""
    cdef const uint8_t[::1] d = data
    cdef Py_ssize_t n = off.shape[0], i, total = 0, size = d.shape[0], at = 0
    if length.shape[0] != n:
        return None
    for i in range(n):
        if off[i] < 0 or length[i] < 0 or off[i] > size - length[i]:
            return None
        total += length[i]
        if total > 0x7FFFFFFF:
            return None
    offsets = np.empty(n + 1, dtype=np.int32)
    cdef int32_t[::1] o = offsets
    out = PyBytes_FromStringAndSize(NULL, total)
    cdef uint8_t *w = <uint8_t *>PyBytes_AS_STRING(out)
    o[0] = 0
    for i in range(n):
        if length[i]:
            memcpy(w + at, &d[off[i]], length[i])
            at += length[i]
        o[i + 1] = <int32_t>at
    return offsets, out


def scan_sets(object walked, const int64_t[::1] set_offsets, const int64_t[::1] ends, const uint8_t[::1] flags,
              const int64_t[::1] counts, const uint64_t[::1] firsts, const uint64_t[::1] lasts, tuple codecs):
    """The messages of walked bundles (a headers-only walk's columns over `walked`) as the buffers of Arrow arrays,
    in one pass: each message set is unpacked after the values so far, parsed there, its keys copied out and its
    values moved down over its headers while the set is still in cache. Returns (seq, ts, key validity bitmap or
    None, null keys, key offsets, key bytes, value offsets, value bytes), offsets int32; None when a message set
    does not unpack or parse, or the keys or values need more than int32 offsets (the caller then decodes the
    bundles, for the precise error or with larger offsets)."""
    cdef const uint8_t[::1] view = walked
    cdef Py_ssize_t size = view.shape[0], nb = counts.shape[0], i, k, length = 0, rows = 0
    cdef Py_ssize_t total = 0, bound = 0, done = 0, kat = 0, vat = 0, nulls = 0
    cdef const uint8_t *b = &view[0] if size else NULL
    cdef int64_t n
    cdef int64_t *spans = NULL  # four columns of `rows` entries each: key_off, key_len, val_off, val_len
    cdef object src = memoryview(walked)
    if not (set_offsets.shape[0] == ends.shape[0] == flags.shape[0] == nb == firsts.shape[0] == lasts.shape[0]):
        raise ValueError("columns of different lengths")
    if len(codecs) != 4:
        raise ValueError("a codec entry per codec id 0..3")
    for i in range(nb):  # every set's length first: it bounds the rows and the bytes, checked before allocating
        n = counts[i]
        if n <= 0 or not 0 <= set_offsets[i] <= ends[i] <= size:
            return None
        if set_length(b, set_offsets[i], ends[i], flags[i], n, codecs, &length) or n > length // 2:
            return None  # (a message takes 2 bytes at least)
        total += n
        bound += length
        if bound > 0x7FFFFFFF:
            return None
    seq_a = np.empty(total, np.uint64)
    ts_a = np.empty(total, np.uint64)
    valid_a = np.zeros((total + 7) // 8, np.uint8)
    koffs_a = np.empty(total + 1, np.int32)
    voffs_a = np.empty(total + 1, np.int32)
    # bytearrays, cut to what they hold at the end (a cut to below half its size gives the rest back, so a batch
    # keeps less than twice its bytes alive); each set is unpacked after the values so far, then its values moved
    keys_out = PyByteArray_FromStringAndSize(NULL, bound)
    values_out = PyByteArray_FromStringAndSize(NULL, bound + PAD)
    cdef uint64_t[::1] seq = seq_a, ts = ts_a
    cdef uint8_t[::1] valid = valid_a
    cdef int32_t[::1] koffs = koffs_a, voffs = voffs_a
    cdef uint8_t *kdata = <uint8_t *>PyByteArray_AS_STRING(keys_out)
    cdef uint8_t *vdata = <uint8_t *>PyByteArray_AS_STRING(values_out)
    cdef uint8_t *at
    cdef object vdata_view = PyMemoryView_FromMemory(<char *>vdata, bound + PAD, PyBUF_WRITE)
    cdef int64_t *koff
    cdef int64_t *klen
    cdef int64_t *voff
    cdef int64_t *vlen
    koffs[0] = 0
    voffs[0] = 0
    try:
        for i in range(nb):
            n = counts[i]
            set_length(b, set_offsets[i], ends[i], flags[i], n, codecs, &length)
            if unpack_set(b, set_offsets[i], ends[i], flags[i], length, codecs, src, vdata, vat, vdata_view):
                return None
            at = vdata + vat
            memset(at + length, 0, PAD)
            if n > rows:  # after the unpack: n is at most half of what the set really holds
                rows = max(n, 2 * rows, 256)
                PyMem_Free(spans)
                spans = <int64_t *>PyMem_Malloc(4 * rows * sizeof(int64_t))
                if spans == NULL:
                    raise MemoryError()
            koff = spans
            klen = spans + rows
            voff = spans + 2 * rows
            vlen = spans + 3 * rows
            if parse_set(at, 0, length, n, (flags[i] & SPARSE) != 0, firsts[i], lasts[i], &seq[done], &ts[done],
                         koff, klen, voff, vlen):
                return None
            for k in range(n):  # parse_set keeps every span inside the set: at most `bound` bytes in all
                if koff[k] >= 0:
                    valid[(done + k) >> 3] |= <uint8_t>(1 << ((done + k) & 7))
                    memcpy(kdata + kat, at + koff[k], klen[k])
                    kat += klen[k]
                else:
                    nulls += 1
                koffs[done + k + 1] = <int32_t>kat
                memmove(vdata + vat, at + voff[k], vlen[k])  # down, over bytes already read: vat <= at + voff[k]
                vat += vlen[k]
                voffs[done + k + 1] = <int32_t>vat
            done += n
    finally:
        PyMem_Free(spans)
    del vdata_view  # the raw view of values_out goes before it is cut
    PyByteArray_Resize(keys_out, kat)
    PyByteArray_Resize(values_out, vat)
    return seq_a, ts_a, valid_a if nulls else None, nulls, koffs_a, keys_out, voffs_a, values_out
