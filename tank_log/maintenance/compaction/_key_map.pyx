# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled key state of compaction (docs/FORMAT.md §6.2): key records, their hashes and the exact key map, with
the same contract as the pure-Python code in `key_state.py` (`_key_map.pyi` gives its types)."""

from cpython.buffer cimport PyBUF_WRITE
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.memoryview cimport PyMemoryView_FromMemory
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

cimport cython

from tank_log.format._codec cimport PAD, SPARSE, parse_set, set_length, unpack_set

import numpy as np

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    /* compaction's key hash: 8 bytes a step (keys are short), the tail read as one overlapping word (a copy of a
       variable length into a word would stall the load that follows it), then a murmur3 finaliser */
    static inline uint64_t tl_hash(const uint8_t *k, size_t n) {
        const uint64_t m = 0xff51afd7ed558ccdULL;
        uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n, w;
        uint32_t lo, hi;
        if (n >= 8) {
            const uint8_t *last = k + n - 8;
            for (; k < last; k += 8) {
                memcpy(&w, k, 8);
                h = (h ^ w) * m;
                h ^= h >> 32;
            }
            memcpy(&w, last, 8);
        } else if (n >= 4) {
            memcpy(&lo, k, 4);
            memcpy(&hi, k + n - 4, 4);
            w = ((uint64_t)hi << 32) | lo;
        } else if (n) {
            w = ((uint64_t)k[0] << 16) | ((uint64_t)k[n >> 1] << 8) | k[n - 1];
        } else {
            w = 0;
        }
        h = (h ^ w) * m;
        h ^= h >> 33;
        h *= m;
        h ^= h >> 33;
        h *= 0xc4ceb9fe1a85ec53ULL;
        h ^= h >> 33;
        return h;
    }
    /* a hint to load the cache line at p: the key map's probes are cache misses (a table of MiBs, random keys) */
    static inline void tl_prefetch(const void *p) {
    #if defined(__GNUC__)
        __builtin_prefetch(p, 0, 3);
    #endif
    }
    /* key equality for the key map's probes: word compares (libc's memcmp is a call, and keys are short) */
    static inline int tl_key_eq(const uint8_t *a, const uint8_t *b, size_t n) {
        uint64_t x, y;
        uint32_t u, v;
        if (n >= 8) {
            size_t i;
            for (i = 0; i + 8 < n; i += 8) {
                memcpy(&x, a + i, 8);
                memcpy(&y, b + i, 8);
                if (x != y) return 0;
            }
            memcpy(&x, a + n - 8, 8);
            memcpy(&y, b + n - 8, 8);
            return x == y;
        }
        if (n >= 4) {
            memcpy(&u, a, 4);
            memcpy(&v, b, 4);
            if (u != v) return 0;
            memcpy(&u, a + n - 4, 4);
            memcpy(&v, b + n - 4, 4);
            return u == v;
        }
        return n == 0 || (a[0] == b[0] && a[n >> 1] == b[n >> 1] && a[n - 1] == b[n - 1]);
    }
    """
    uint64_t tl_hash(const uint8_t *k, size_t n) noexcept nogil
    bint tl_key_eq(const uint8_t *a, const uint8_t *b, size_t n) noexcept nogil
    void tl_prefetch(const void *p) noexcept nogil


cdef uint64_t U32_MAX = 0xFFFFFFFF
cdef enum:
    AHEAD = 8  # the key map hashes the key of the message this many ahead and prefetches its slot (a power of 2)
    RECORD_HEAD = 6  # a key record: u8 key length, the message's ordinal as 5 bytes little-endian, then the key
    MAX_KEY = 255


cdef inline uint64_t _load_ord(const uint8_t *e) noexcept nogil:
    """A key record's ordinal (5 bytes little-endian after the length byte)."""
    return (<uint64_t>e[1] | (<uint64_t>e[2] << 8) | (<uint64_t>e[3] << 16) | (<uint64_t>e[4] << 24)
            | (<uint64_t>e[5] << 32))


cdef inline void _store_ord(uint8_t *e, uint64_t o) noexcept nogil:
    e[1] = <uint8_t>o
    e[2] = <uint8_t>(o >> 8)
    e[3] = <uint8_t>(o >> 16)
    e[4] = <uint8_t>(o >> 24)
    e[5] = <uint8_t>(o >> 32)


cdef inline bint _bad_key(int64_t off, int64_t kl, Py_ssize_t size) noexcept nogil:
    return off < 0 or kl < 0 or kl > MAX_KEY or off + kl > size


def key_hashes(object data, const int64_t[::1] key_off, const int64_t[::1] key_len):
    """Each message's key hash (the key map's, `tl_hash`); 0 for a keyless one (key_off -1)."""
    cdef const uint8_t[::1] view = data
    cdef const uint8_t *d = &view[0] if view.shape[0] else NULL
    cdef Py_ssize_t n = key_off.shape[0], i, size = view.shape[0]
    out = np.zeros(n, dtype=np.uint64)
    cdef uint64_t[::1] o = out
    for i in range(n):
        if key_off[i] < 0:
            continue
        if _bad_key(key_off[i], key_len[i], size):
            raise ValueError("key outside the data")
        o[i] = tl_hash(d + key_off[i], key_len[i])
    return out


def pack_records(object data, const int64_t[::1] key_off, const int64_t[::1] key_len, const uint64_t[::1] ords,
                 const int64_t[::1] rows):
    """The key records (u8 length, 5-byte ordinal, key) of messages `rows`, in that order, as one bytes object."""
    cdef const uint8_t[::1] view = data
    cdef const uint8_t *d = &view[0] if view.shape[0] else NULL
    cdef Py_ssize_t n = rows.shape[0], i, r, size = view.shape[0], total = 0, w = 0
    cdef int64_t kl
    for i in range(n):
        r = rows[i]
        if r < 0 or r >= key_off.shape[0]:
            raise IndexError("row outside the columns")
        if _bad_key(key_off[r], key_len[r], size):
            raise ValueError("key outside the data")
        if ords[r] >> 40:
            raise ValueError("ordinal beyond 2**40")
        total += RECORD_HEAD + key_len[r]
    out = PyBytes_FromStringAndSize(NULL, total)
    cdef uint8_t *o = <uint8_t *>PyBytes_AS_STRING(out)
    for i in range(n):
        r = rows[i]
        kl = key_len[r]
        o[w] = <uint8_t>kl
        _store_ord(o + w, ords[r])
        if kl:
            memcpy(o + w + RECORD_HEAD, d + key_off[r], kl)
        w += RECORD_HEAD + kl
    return out


def unpack_records(object data):
    """The complete key records at the start of `data`: (key_off, key_len, ords, end), `end` the offset after the
    last complete one (a record cut at the end of `data` is left for the next read)."""
    cdef const uint8_t[::1] view = data
    cdef const uint8_t *d = &view[0] if view.shape[0] else NULL
    cdef Py_ssize_t size = view.shape[0], p = 0, n = 0, i
    while p + RECORD_HEAD <= size and p + RECORD_HEAD + d[p] <= size:
        p += RECORD_HEAD + d[p]
        n += 1
    key_off = np.empty(n, dtype=np.int64)
    key_len = np.empty(n, dtype=np.int64)
    ords = np.empty(n, dtype=np.uint64)
    cdef int64_t[::1] ko = key_off
    cdef int64_t[::1] kn = key_len
    cdef uint64_t[::1] od = ords
    p = 0
    for i in range(n):
        ko[i] = p + RECORD_HEAD
        kn[i] = d[p]
        od[i] = _load_ord(d + p)
        p += RECORD_HEAD + d[p]
    return key_off, key_len, ords, p


@cython.final  # its cdef methods are called directly, so the probe inlines into the loops over messages
cdef class KeyMap:
    """Exact key → the ordinal of its latest message, for compaction's first pass (docs/FORMAT.md §6.2).

    Each key is held once, as a record (u8 length, the ordinal, the key bytes) in an arena of fixed-size blocks: a
    4-byte ordinal, or 5 with `wide` (inputs of 2**32 messages or more; `records` gives the 5-byte key records of
    the spill either way). The hash table is open addressing with linear probing over a control byte (empty, or 7
    bits of the key's hash) and a u32 reference to the record per slot, 72-90% full (it grows by a quarter once
    large), indexed by multiply-shift so that any size works. Probes compare control bytes (64 to a cache line) and
    the full key only where they match: exact, no collision possible. About 6-7 bytes a slot per key plus 5 + the
    key's bytes: 22-24 B per 11- or 12-byte key (Kafka's offset map takes 24, digests only). Slots and arena never
    exceed `budget` bytes together, growth included; `add` stops at the first new key that does not fit.

    A probe is a cache miss or two (the control byte, then the key): `add` hashes the key AHEAD messages on and
    prefetches its slot, and halfway there the record in that slot."""

    cdef uint8_t *ctrl
    cdef uint32_t *refs
    cdef uint8_t **blocks
    cdef Py_ssize_t *block_used
    cdef Py_ssize_t nslots, used, nblocks, blocks_cap, block_size, head
    cdef uint64_t max_ord
    cdef public Py_ssize_t budget  # lowered as other key state grows (the survivors' bits)

    def __cinit__(self, Py_ssize_t budget, bint wide=False):
        self.budget = budget
        self.head = RECORD_HEAD if wide else RECORD_HEAD - 1
        self.max_ord = (1ULL << 40) - 1 if wide else U32_MAX
        self.nslots = 0
        self.used = 0
        self.nblocks = 0
        self.blocks_cap = 0
        self.ctrl = NULL
        self.refs = NULL
        self.blocks = NULL
        self.block_used = NULL
        self.block_size = 512  # a record fits (6 + 255); blocks grow with the budget to a 64th of it, at most 256 KiB
        while self.block_size < (256 << 10) and self.block_size * 64 <= budget:
            self.block_size *= 2

    def __dealloc__(self):
        cdef Py_ssize_t i
        for i in range(self.nblocks):
            PyMem_Free(self.blocks[i])
        PyMem_Free(self.blocks)
        PyMem_Free(self.block_used)
        PyMem_Free(self.ctrl)
        PyMem_Free(self.refs)

    def __len__(self):
        return self.used

    @property
    def wide(self):
        return self.head == RECORD_HEAD

    @property
    def nbytes(self):
        """Bytes held: slots (5 each) + arena blocks."""
        return self.nslots * 5 + self.nblocks * self.block_size

    cdef inline Py_ssize_t _home(self, uint64_t h, Py_ssize_t n) noexcept:
        return <Py_ssize_t>(((h & U32_MAX) * <uint64_t>n) >> 32)

    cdef inline uint8_t *_record(self, uint32_t ref) noexcept:
        return self.blocks[ref // self.block_size] + ref % self.block_size

    cdef inline uint64_t _ord(self, const uint8_t *e) noexcept:
        cdef uint32_t v
        if self.head == RECORD_HEAD:
            return _load_ord(e)
        memcpy(&v, e + 1, 4)
        return v

    cdef inline void _set_ord(self, uint8_t *e, uint64_t o) noexcept:
        cdef uint32_t v = <uint32_t>o
        if self.head == RECORD_HEAD:
            _store_ord(e, o)
        else:
            memcpy(e + 1, &v, 4)

    cdef bint _grow_slots(self, bint cautious) noexcept:
        """Double the slots (or take what the budget leaves, if that is still more, unless `cautious`); rehash from
        the arena."""
        cdef Py_ssize_t arena = self.nblocks * self.block_size, n, fit, b, p, j
        cdef uint8_t *ctrl
        cdef uint32_t *refs
        cdef uint8_t *e
        cdef uint64_t h
        # double while small, then by a quarter: 72-90% full once large, so the slots cost 6-7 B per key
        n = 64 if self.nslots == 0 else (self.nslots * 2 if self.nslots < (1 << 16) else self.nslots + self.nslots // 4)
        fit = (self.budget - arena - self.nslots * 5) // 5  # while rehashing, the old and the new slots are both held
        if n > fit:
            if cautious:
                return False
            n = fit
        if n > <Py_ssize_t>U32_MAX:
            n = <Py_ssize_t>U32_MAX
        if n <= self.nslots or n * 9 < (self.used + 1) * 10:  # also a budget already spent (fit < 0)
            return False
        ctrl = <uint8_t *>PyMem_Malloc(n)
        refs = <uint32_t *>PyMem_Malloc(n * 4)
        if ctrl == NULL or refs == NULL:
            PyMem_Free(ctrl)
            PyMem_Free(refs)
            return False
        memset(ctrl, 0, n)
        for b in range(self.nblocks):
            p = 0
            while p < self.block_used[b]:
                e = self.blocks[b] + p
                h = tl_hash(e + self.head, e[0])
                j = self._home(h, n)
                while ctrl[j]:
                    j = j + 1 if j + 1 < n else 0
                ctrl[j] = <uint8_t>(0x80 | (h >> 57))
                refs[j] = <uint32_t>(b * self.block_size + p)
                p += self.head + e[0]
        PyMem_Free(self.ctrl)
        PyMem_Free(self.refs)
        self.ctrl, self.refs, self.nslots = ctrl, refs, n
        return True

    cdef uint8_t *_new_record(self, Py_ssize_t kl) noexcept:
        """Room for a record of a kl-byte key at the end of the arena (a new block if the last one is full), or NULL
        when the budget has none."""
        cdef Py_ssize_t need = self.head + kl, b = self.nblocks - 1
        cdef uint8_t **grown
        cdef Py_ssize_t *grown_used
        cdef uint8_t *block
        if b >= 0 and self.block_used[b] + need <= self.block_size:
            self.block_used[b] += need
            return self.blocks[b] + self.block_used[b] - need
        if self.nslots * 5 + (self.nblocks + 1) * self.block_size > self.budget:
            return NULL
        if <uint64_t>((self.nblocks + 1) * self.block_size) > U32_MAX:  # refs are u32
            return NULL
        if self.nblocks == self.blocks_cap:
            self.blocks_cap = 16 if self.blocks_cap == 0 else self.blocks_cap * 2
            grown = <uint8_t **>PyMem_Realloc(self.blocks, self.blocks_cap * sizeof(uint8_t *))
            if grown == NULL:
                return NULL
            self.blocks = grown
            grown_used = <Py_ssize_t *>PyMem_Realloc(self.block_used, self.blocks_cap * sizeof(Py_ssize_t))
            if grown_used == NULL:
                return NULL
            self.block_used = grown_used
        block = <uint8_t *>PyMem_Malloc(self.block_size)
        if block == NULL:
            return NULL
        self.blocks[self.nblocks] = block
        self.block_used[self.nblocks] = need
        self.nblocks += 1
        return block

    cdef inline Py_ssize_t _find(self, const uint8_t *k, Py_ssize_t n, uint64_t h) noexcept:
        """The slot holding key k, or the empty slot where it would go."""
        cdef Py_ssize_t j = self._home(h, self.nslots)
        cdef uint8_t tag = <uint8_t>(0x80 | (h >> 57))
        cdef uint8_t c
        cdef uint8_t *e
        while True:
            c = self.ctrl[j]
            if c == 0:
                return j
            if c == tag:
                e = self._record(self.refs[j])
                if e[0] == n and tl_key_eq(e + self.head, k, n):
                    return j
            j = j + 1 if j + 1 < self.nslots else 0

    cdef inline uint64_t _hash_ahead(self, const uint8_t *d, Py_ssize_t size, const int64_t *key_off,
                                     const int64_t *key_len, Py_ssize_t i) noexcept:
        """Row i's key hash, its slot prefetched (0 for a keyless row or a key outside the data: `add` then raises
        when the row's turn comes)."""
        cdef int64_t off = key_off[i], kl = key_len[i]
        cdef uint64_t h
        cdef Py_ssize_t j
        if _bad_key(off, kl, size):
            return 0
        h = tl_hash(d + off, kl)
        if self.nslots:
            j = self._home(h, self.nslots)
            tl_prefetch(&self.ctrl[j])
            tl_prefetch(&self.refs[j])
        return h

    cdef inline void _key_ahead(self, uint64_t h) noexcept:
        """Prefetch the record in the first slot that a key of hash h probes (its slot was prefetched earlier)."""
        cdef Py_ssize_t j
        if self.nslots:
            j = self._home(h, self.nslots)
            if self.ctrl[j]:
                tl_prefetch(self._record(self.refs[j]))

    def add(self, object data, const int64_t[::1] key_off, const int64_t[::1] key_len, const uint64_t[::1] ords):
        """Record each keyed message's ordinal as its key's latest (ordinals increase; keyless rows, key_off -1, are
        passed over). Returns how many messages were taken: all of them, or up to the first new key that does not
        fit in the budget."""
        cdef const uint8_t[::1] view = data
        cdef Py_ssize_t n = ords.shape[0]
        if key_off.shape[0] != n or key_len.shape[0] != n:
            raise ValueError("columns of different lengths")
        if n == 0:
            return 0
        return self._add(&view[0] if view.shape[0] else NULL, view.shape[0], &key_off[0], &key_len[0], &ords[0], n, False)

    def add_sets(self, object walked, const int64_t[::1] set_offsets, const int64_t[::1] ends,
                 const uint8_t[::1] flags, const int64_t[::1] counts, const uint64_t[::1] firsts,
                 const uint64_t[::1] lasts, uint64_t first_ord, tuple codecs, uint8_t[::1] marked):
        """`add` straight from walked bundles (a headers-only walk's columns over `walked`), without their columns:
        each message set is unpacked into one small reused buffer and parsed there (`_codec.parse_set`), so it is
        still in cache when its keys are hashed. The messages' ordinals are first_ord, first_ord + 1, ... in order.
        Returns how many messages were taken; `marked[i]` is then 1 for each keyless message and tombstone (empty
        value) among them, 0 for the others. Fewer than all are taken where a message set does not unpack or parse,
        or where the budget limits a step of the map: it stops there instead of shrinking the step to fit, so that
        a budget lowered for marks the messages may not need changes nothing (the caller decodes the bundles and
        goes on from there with `add`, for the precise error or with the exact budget)."""
        cdef const uint8_t[::1] view = walked
        cdef Py_ssize_t size = view.shape[0], nb = counts.shape[0], i, k, length = 0, cap = 0, rows = 0, taken
        cdef Py_ssize_t done = 0, total = 0
        cdef const uint8_t *b = &view[0] if size else NULL
        cdef int64_t n
        cdef uint8_t *buf = NULL
        cdef uint8_t *grown
        cdef uint64_t *cols = NULL  # six columns of `rows` entries each: seq, ts, key_off, key_len, val_off, val_len
        cdef int64_t *koff
        cdef int64_t *klen
        cdef int64_t *vlen
        cdef uint64_t *ords = NULL
        cdef object src = memoryview(walked), buf_view = None
        if not (set_offsets.shape[0] == ends.shape[0] == flags.shape[0] == nb == firsts.shape[0] == lasts.shape[0]):
            raise ValueError("columns of different lengths")
        if len(codecs) != 4:
            raise ValueError("a codec entry per codec id 0..3")
        for i in range(nb):
            if counts[i] <= 0 or counts[i] > marked.shape[0] - total:
                raise ValueError("a bundle without messages, or marked shorter than the messages")
            total += counts[i]
        if <uint64_t>total > ~first_ord:
            raise ValueError("ordinals beyond 2**64")
        try:
            for i in range(nb):
                n = counts[i]
                if not 0 <= set_offsets[i] <= ends[i] <= size:
                    return done
                if set_length(b, set_offsets[i], ends[i], flags[i], n, codecs, &length) or n > length // 2:
                    return done  # (a message takes 2 bytes at least)
                if length + PAD > cap:
                    cap = max(length + PAD, 2 * cap, 1 << 15)
                    grown = <uint8_t *>PyMem_Realloc(buf, cap)
                    if grown == NULL:
                        raise MemoryError()
                    buf = grown
                    buf_view = PyMemoryView_FromMemory(<char *>buf, cap, PyBUF_WRITE)
                if unpack_set(b, set_offsets[i], ends[i], flags[i], length, codecs, src, buf, 0, buf_view):
                    return done
                memset(buf + length, 0, PAD)
                if n > rows:  # after the unpack: n is at most half of what the set really holds
                    rows = max(n, 2 * rows, 256)
                    PyMem_Free(cols)
                    PyMem_Free(ords)
                    cols = <uint64_t *>PyMem_Malloc(6 * rows * sizeof(uint64_t))
                    ords = <uint64_t *>PyMem_Malloc(rows * sizeof(uint64_t))
                    if cols == NULL or ords == NULL:
                        raise MemoryError()
                koff = <int64_t *>(cols + 2 * rows)
                klen = <int64_t *>(cols + 3 * rows)
                vlen = <int64_t *>(cols + 5 * rows)
                if parse_set(buf, 0, length, n, (flags[i] & SPARSE) != 0, firsts[i], lasts[i], cols, cols + rows,
                             koff, klen, <int64_t *>(cols + 4 * rows), vlen):
                    return done
                for k in range(n):
                    ords[k] = first_ord + done + k
                    marked[done + k] = koff[k] < 0 or vlen[k] == 0
                taken = self._add(buf, length, koff, klen, ords, n, True)
                done += taken
                if taken < n:
                    return done
            return done
        finally:
            PyMem_Free(buf)
            PyMem_Free(cols)
            PyMem_Free(ords)

    cdef Py_ssize_t _add(self, const uint8_t *d, Py_ssize_t size, const int64_t *key_off, const int64_t *key_len,
                         const uint64_t *ords, Py_ssize_t n, bint cautious) except -1:
        """`add` over n rows of columns (n > 0); `cautious`: a step the budget limits stops it instead of shrinking to
        fit (`add_sets`)."""
        cdef Py_ssize_t i, j
        cdef int64_t kl
        cdef uint8_t *e
        cdef uint64_t h
        cdef uint64_t ahead[AHEAD]
        for i in range(min(n, AHEAD)):
            ahead[i] = self._hash_ahead(d, size, key_off, key_len, i)
        for i in range(n):
            h = ahead[i & (AHEAD - 1)]
            if i + AHEAD < n:
                ahead[i & (AHEAD - 1)] = self._hash_ahead(d, size, key_off, key_len, i + AHEAD)
            if i + AHEAD // 2 < n:
                self._key_ahead(ahead[(i + AHEAD // 2) & (AHEAD - 1)])
            if key_off[i] < 0:
                continue
            kl = key_len[i]
            if _bad_key(key_off[i], kl, size):
                raise ValueError("key outside the data")
            if ords[i] > self.max_ord:
                if ords[i] >> 40:
                    raise ValueError("ordinal beyond 2**40")
                return i  # a narrow map holds no ordinal past 2**32: the rest spills
            if self.nslots == 0 and not self._grow_slots(cautious):
                return i
            j = self._find(d + key_off[i], kl, h)
            if self.ctrl[j] == 0:
                if (self.used + 1) * 10 > self.nslots * 9:
                    if not self._grow_slots(cautious):
                        return i
                    j = self._find(d + key_off[i], kl, h)
                e = self._new_record(kl)
                if e == NULL:
                    return i
                e[0] = <uint8_t>kl
                if kl:
                    memcpy(e + self.head, d + key_off[i], kl)
                self.ctrl[j] = <uint8_t>(0x80 | (h >> 57))
                self.refs[j] = <uint32_t>((self.nblocks - 1) * self.block_size + (e - self.blocks[self.nblocks - 1]))
                self.used += 1
            else:
                e = self._record(self.refs[j])
            self._set_ord(e, ords[i])
        return n

    def mark(self, uint8_t[::1] bits):
        """Set the bit of every key's latest ordinal in `bits` (bit o % 8 of byte o // 8)."""
        cdef Py_ssize_t b, p, nbits = bits.shape[0] * 8
        cdef uint64_t o
        cdef uint8_t *e
        for b in range(self.nblocks):
            p = 0
            while p < self.block_used[b]:
                e = self.blocks[b] + p
                o = self._ord(e)
                if o >= <uint64_t>nbits:
                    raise IndexError("an ordinal beyond the bits")
                bits[o >> 3] |= <uint8_t>(1 << (o & 7))
                p += self.head + e[0]

    def records(self):
        """Every key with its latest ordinal as key records (5-byte ordinals), one bytes object per arena block, a
        block at a time (a generator: never a second copy of the whole arena)."""
        cdef Py_ssize_t b
        for b in range(self.nblocks):
            yield self._block_records(b)

    cdef bytes _block_records(self, Py_ssize_t b):
        cdef Py_ssize_t p = 0, w = 0, n = 0
        cdef uint8_t *e
        cdef uint8_t *o
        if self.head == RECORD_HEAD:
            return PyBytes_FromStringAndSize(<char *>self.blocks[b], self.block_used[b])
        while p < self.block_used[b]:
            p += self.head + self.blocks[b][p]
            n += 1
        rec = PyBytes_FromStringAndSize(NULL, self.block_used[b] + n)
        o = <uint8_t *>PyBytes_AS_STRING(rec)
        p = 0
        while p < self.block_used[b]:
            e = self.blocks[b] + p
            o[w] = e[0]
            _store_ord(o + w, self._ord(e))
            memcpy(o + w + RECORD_HEAD, e + self.head, e[0])
            p += self.head + e[0]
            w += RECORD_HEAD + e[0]
        return rec
