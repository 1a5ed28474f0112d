# The parts of the compiled codec that other compiled modules call directly (`cimport`): one message set at a time,
# for loops that keep a set in a small buffer instead of gathering a chunk (compaction's first pass, `_key_map.pyx`).
from libc.stdint cimport int64_t, uint8_t, uint64_t

cdef enum:
    SPARSE = 0x40  # the bundle flag of §3.3
    PAD = 512  # readable zero bytes a message set needs after its end (decode.py's padding): see parse_set

cdef int set_length(const uint8_t *b, Py_ssize_t set_off, Py_ssize_t end, uint8_t flags, int64_t count,
                    tuple codecs, Py_ssize_t *length) except -1
cdef int unpack_set(const uint8_t *b, Py_ssize_t set_off, Py_ssize_t end, uint8_t flags, Py_ssize_t length,
                    tuple codecs, object src, uint8_t *out, Py_ssize_t at, object out_view) except -1
cdef int parse_set(const uint8_t *buf, Py_ssize_t p, Py_ssize_t end, int64_t n, bint sparse, uint64_t first,
                   uint64_t last, uint64_t *seq_o, uint64_t *ts_o, int64_t *koff_o, int64_t *klen_o,
                   int64_t *voff_o, int64_t *vlen_o) noexcept nogil
