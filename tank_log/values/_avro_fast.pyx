# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled Avro fast path (`avro.AvroDecoder.fast`): a batch of schemaless Avro values, given as spans of one
buffer, decoded straight into column buffers, one slot per row and schema node: no Python object per value.

The schema comes as a flat program (`avro._FastPlan`): per node its kind, its union's null branch (-1 when it is
not a [null, T] union), an argument (a fixed's size, an enum's symbol count) and its children (a record's fields).
Every value is checked as the pure path checks it: it ends exactly at its length, varints are well-formed, union
branches and enum indexes are in range, strings are UTF-8, ints and dates and timestamps are in range. A bad value
is reported (code, byte, node, value) and all its columns are null; the error's text is written in `avro.py`.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcpy, memset

from tank_log.values._fast_common cimport valid_utf8

# node kinds (avro._FastPlan gives the same numbers)
cdef enum:
    K_NULL = 0
    K_BOOL = 1
    K_INT = 2
    K_LONG = 3
    K_FLOAT = 4
    K_DOUBLE = 5
    K_STRING = 6
    K_BYTES = 7
    K_FIXED = 8
    K_ENUM = 9
    K_RECORD = 10
    K_DATE = 11
    K_TS_MILLIS = 12
    K_TS_MICROS = 13

# error codes (avro.py writes their text)
cdef enum:
    E_TRUNCATED = 1
    E_VARINT = 2
    E_BRANCH = 3
    E_ENUM = 4
    E_UTF8 = 5
    E_LENGTH = 6
    E_INT = 7
    E_DATE = 8
    E_TIMESTAMP = 9
    E_LEFTOVER = 10
    E_TOO_BIG = 11

# the range of Python's date and datetime (what the pure path converts to): days and µs from 1970-01-01
cdef extern from *:
    """
    #define TL_MIN_DAYS (-719162LL)
    #define TL_MAX_DAYS (2932896LL)
    #define TL_MIN_US (-62135596800000000LL)
    #define TL_MAX_US (253402300799999999LL)
    #define TL_INT32_MIN (-2147483648LL)
    #define TL_INT32_MAX (2147483647LL)
    """
    const int64_t MIN_DAYS "TL_MIN_DAYS"
    const int64_t MAX_DAYS "TL_MAX_DAYS"
    const int64_t MIN_US "TL_MIN_US"
    const int64_t MAX_US "TL_MAX_US"
    const int64_t INT32_MIN "TL_INT32_MIN"
    const int64_t INT32_MAX "TL_INT32_MAX"

cdef struct Ctx:
    const uint8_t* p
    Py_ssize_t pos
    Py_ssize_t end
    Py_ssize_t row
    Py_ssize_t n
    int err
    Py_ssize_t err_pos
    Py_ssize_t err_node
    int64_t err_val
    const int64_t* kind
    const int64_t* nullidx
    const int64_t* arg
    const int64_t* first
    const int64_t* nchild
    const int64_t* children
    uint8_t* valid  # nodes × n
    char** vals  # per node: its fixed-width values (n), or NULL
    int32_t** offs  # per node: its offsets (n + 1), or NULL
    char** data  # per node: its bytes (grown), or NULL
    Py_ssize_t* size
    Py_ssize_t* cap


cdef inline int _fail(Ctx* c, int code, Py_ssize_t pos, Py_ssize_t node, int64_t val) noexcept nogil:
    c.err = code
    c.err_pos = pos
    c.err_node = node
    c.err_val = val
    return -1


cdef inline int _long(Ctx* c, Py_ssize_t node, int64_t* out) noexcept nogil:
    """A zig-zag varint of at most 64 bits."""
    cdef uint64_t acc = 0
    cdef int shift = 0
    cdef uint8_t b
    while True:
        if c.pos >= c.end:
            return _fail(c, E_TRUNCATED, c.end, node, 0)
        b = c.p[c.pos]
        c.pos += 1
        if shift == 63 and b > 1:
            return _fail(c, E_VARINT, c.pos, node, 0)
        acc |= (<uint64_t>(b & 0x7F)) << shift
        if not (b & 0x80):
            break
        shift += 7
    out[0] = <int64_t>((acc >> 1) ^ (0 - (acc & 1)))
    return 0


cdef inline int _append(Ctx* c, Py_ssize_t node, const uint8_t* src, Py_ssize_t length) noexcept nogil:
    cdef Py_ssize_t need = c.size[node] + length
    cdef Py_ssize_t cap = c.cap[node]
    cdef char* grown
    if need > INT32_MAX:
        return _fail(c, E_TOO_BIG, c.pos, node, need)
    if need > cap:
        while cap < need:
            cap = cap * 2 if cap else 4096
        grown = <char*>realloc(c.data[node], cap)
        if grown == NULL:
            return _fail(c, E_TOO_BIG, c.pos, node, need)
        c.data[node] = grown
        c.cap[node] = cap
    memcpy(c.data[node] + c.size[node], src, length)
    c.size[node] = need
    return 0


cdef int _node(Ctx* c, Py_ssize_t node) noexcept nogil:
    cdef int64_t v = 0
    cdef Py_ssize_t start, length, i, k = c.kind[node]
    cdef int64_t nulls = c.nullidx[node]
    if nulls >= 0:
        if _long(c, node, &v):
            return -1
        if v < 0 or v > 1:
            return _fail(c, E_BRANCH, c.pos, node, v)
        if v == nulls:
            return 0
    if k == K_NULL:
        return 0
    c.valid[node * c.n + c.row] = 1
    if k == K_RECORD:
        for i in range(c.first[node], c.first[node] + c.nchild[node]):
            if _node(c, c.children[i]):
                return -1
        return 0
    if k == K_BOOL:
        if c.pos >= c.end:
            return _fail(c, E_TRUNCATED, c.end, node, 0)
        (<uint8_t*>c.vals[node])[c.row] = c.p[c.pos] != 0  # as fastavro reads it: any byte but 0 is true
        c.pos += 1
        return 0
    if k == K_FLOAT or k == K_DOUBLE:
        length = 4 if k == K_FLOAT else 8
        if c.end - c.pos < length:
            return _fail(c, E_TRUNCATED, c.end, node, 0)
        memcpy(c.vals[node] + c.row * length, c.p + c.pos, length)
        c.pos += length
        return 0
    if k == K_STRING or k == K_BYTES or k == K_FIXED:
        if k == K_FIXED:
            v = c.arg[node]
        else:
            if _long(c, node, &v):
                return -1
            if v < 0:
                return _fail(c, E_LENGTH, c.pos, node, v)
        if v > c.end - c.pos:
            return _fail(c, E_TRUNCATED, c.end, node, 0)
        start = c.pos
        c.pos += v
        if k == K_STRING and not valid_utf8(c.p + start, v):
            return _fail(c, E_UTF8, c.pos, node, start)
        return _append(c, node, c.p + start, v)
    if _long(c, node, &v):
        return -1
    if k == K_LONG:
        (<int64_t*>c.vals[node])[c.row] = v
    elif k == K_INT:
        if v < INT32_MIN or v > INT32_MAX:
            return _fail(c, E_INT, c.pos, node, v)
        (<int32_t*>c.vals[node])[c.row] = <int32_t>v
    elif k == K_ENUM:
        if v < 0 or v >= c.arg[node]:
            return _fail(c, E_ENUM, c.pos, node, v)
        (<int32_t*>c.vals[node])[c.row] = <int32_t>v
    elif k == K_DATE:
        if v < MIN_DAYS or v > MAX_DAYS:
            return _fail(c, E_DATE, c.pos, node, v)
        (<int32_t*>c.vals[node])[c.row] = <int32_t>v
    elif k == K_TS_MILLIS:
        if v < MIN_US // 1000 or v > MAX_US // 1000:
            return _fail(c, E_TIMESTAMP, c.pos, node, v)
        (<int64_t*>c.vals[node])[c.row] = v * 1000
    else:  # K_TS_MICROS
        if v < MIN_US or v > MAX_US:
            return _fail(c, E_TIMESTAMP, c.pos, node, v)
        (<int64_t*>c.vals[node])[c.row] = v
    return 0


def decode(
    const uint8_t[::1] data,
    const int64_t[::1] starts,
    const int64_t[::1] ends,
    const uint8_t[::1] eligible,
    const int64_t[::1] kind,
    const int64_t[::1] nullidx,
    const int64_t[::1] arg,
    const int64_t[::1] first,
    const int64_t[::1] nchild,
    const int64_t[::1] children,
    uint8_t[:, ::1] valid,
    list vals,
    list offs,
    uint8_t[::1] bad,
    int8_t[::1] err_code,
    int64_t[::1] err_pos,
    int64_t[::1] err_node,
    int64_t[::1] err_val,
):
    """Decode the eligible rows into `valid` (nodes × rows), `vals` (per node a writable array or None) and `offs`
    (per node an int32 array of rows + 1, or None); returns per node its bytes (or None). A bad row is marked in
    `bad` with its error (code, byte, node, value) and its columns are null. None when a string or bytes column
    would pass 2 GiB (int32 offsets): nothing of the batch is then usable."""
    cdef Py_ssize_t n = starts.shape[0]
    cdef Py_ssize_t nodes = kind.shape[0]
    cdef Py_ssize_t i, j
    cdef Ctx c
    cdef uint8_t[::1] mv
    cdef int32_t[::1] ov
    cdef const uint8_t* base = &data[0] if data.shape[0] else NULL
    cdef int32_t* o
    memset(&c, 0, sizeof(Ctx))
    c.n = n
    c.kind = &kind[0]
    c.nullidx = &nullidx[0]
    c.arg = &arg[0]
    c.first = &first[0]
    c.nchild = &nchild[0]
    c.children = &children[0] if children.shape[0] else NULL
    c.valid = &valid[0, 0] if n else NULL
    c.vals = <char**>PyMem_Malloc(nodes * sizeof(char*))
    c.offs = <int32_t**>PyMem_Malloc(nodes * sizeof(int32_t*))
    c.data = <char**>PyMem_Malloc(nodes * sizeof(char*))
    c.size = <Py_ssize_t*>PyMem_Malloc(nodes * sizeof(Py_ssize_t))
    c.cap = <Py_ssize_t*>PyMem_Malloc(nodes * sizeof(Py_ssize_t))
    if not (c.vals and c.offs and c.data and c.size and c.cap):
        PyMem_Free(c.vals); PyMem_Free(c.offs); PyMem_Free(c.data); PyMem_Free(c.size); PyMem_Free(c.cap)
        raise MemoryError()
    try:
        for j in range(nodes):
            c.vals[j] = NULL
            c.offs[j] = NULL
            c.data[j] = NULL
            c.size[j] = 0
            c.cap[j] = 0
            if vals[j] is not None and n:
                mv = vals[j]
                c.vals[j] = <char*>&mv[0]
            if offs[j] is not None:
                ov = offs[j]
                c.offs[j] = &ov[0]
                ov[0] = 0
        with nogil:
            for i in range(n):
                if eligible[i]:
                    c.p = base + starts[i]
                    c.pos = 0
                    c.end = ends[i] - starts[i]
                    c.row = i
                    c.err = 0
                    if _node(&c, 0) == 0 and c.pos != c.end:
                        _fail(&c, E_LEFTOVER, c.pos, 0, c.end - c.pos)
                    if c.err == E_TOO_BIG:
                        break
                    if c.err:
                        bad[i] = 1
                        err_code[i] = <int8_t>c.err
                        err_pos[i] = c.err_pos
                        err_node[i] = c.err_node
                        err_val[i] = c.err_val
                        for j in range(nodes):
                            c.valid[j * n + i] = 0
                            if c.offs[j] != NULL:
                                c.size[j] = c.offs[j][i]
                for j in range(nodes):
                    o = c.offs[j]
                    if o != NULL:
                        o[i + 1] = <int32_t>c.size[j]
        if c.err == E_TOO_BIG:
            return None  # a column of this batch would pass 2 GiB: the caller decodes it the other way
        out = []
        for j in range(nodes):
            if c.offs[j] == NULL:
                out.append(None)
            elif c.data[j] == NULL:
                out.append(b"")
            else:
                out.append(PyBytes_FromStringAndSize(c.data[j], c.size[j]))
        return out
    finally:
        for j in range(nodes):
            free(c.data[j])
        PyMem_Free(c.vals); PyMem_Free(c.offs); PyMem_Free(c.data); PyMem_Free(c.size); PyMem_Free(c.cap)
