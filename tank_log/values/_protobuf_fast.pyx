# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled Protobuf fast path (`protobuf.ProtobufDecoder`, its `_FastPlan`): a batch of Protobuf messages, given
as spans of one buffer, walked on the wire format straight into column slots: no Python object per message.

The message comes as a flat program (`protobuf._FastPlan`): per node its kind (a message, a varint, fixed32/64,
string, bytes, a repeated field, a map), its slot group, its default validity, and for a message its fields by
number. A group is a slot space: the rows (group 0), or the elements of one repeated field or map; every node of a
group has one slot per element of it (value, length, validity). A field read again overwrites its slot (the last one
wins), a message read again merges into its slot, a repeated field appends to its group, as protobuf reads them.

Every message is checked as upb checks it (google.protobuf's parser), so that both give the same verdict and the
same error: tags of at most 5 bytes and 32 bits, field number 0, wire types 6 and 7, varints of at most 10 bytes,
packed fixed-width lengths, end-group tags, a nesting depth of 100, UTF-8 strings; a message within its parent's
end, other lengths within the value and a field that runs past its message's end found after it is read (as upb
does: a string there is checked for UTF-8 first). Fields of unknown numbers or of another wire type are skipped (a map entry with one is left out of its map,
as upb moves it to the unknown fields). A message whose oneof switches away from a message member is handed back
(E_DEFER) to protobuf's parser: upb starts that member afresh, which slots cannot.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcpy, memset

from tank_log.values._fast_common cimport valid_utf8
from cython.view cimport array as cvarray

# node kinds (protobuf._FastPlan gives the same numbers)
cdef enum:
    K_MSG = 0
    K_VARINT = 1
    K_FIX32 = 2
    K_FIX64 = 3
    K_STRING = 4
    K_BYTES = 5
    K_LIST = 6
    K_MAP = 7

# how a varint becomes its value (upb's munging)
cdef enum:
    M_RAW = 0
    M_INT32 = 1
    M_UINT32 = 2
    M_SINT32 = 3
    M_SINT64 = 4
    M_BOOL = 5

# row codes (protobuf.py writes their text)
cdef enum:
    E_MALFORMED = 1
    E_UTF8 = 2
    E_DEFER = 3
    E_NOMEM = 4

cdef enum:
    MAX_DEPTH = 100  # upb's default nesting limit

cdef extern from *:
    """
    #define TL_INT32_LIMIT (2147483647LL)
    """
    const int64_t INT32_LIMIT "TL_INT32_LIMIT"


cdef struct Ctx:
    const uint8_t* base
    Py_ssize_t stop  # the value's end: every read stops there; a message's own end is checked after each field
    int err
    const int64_t* kind
    const int64_t* arg
    const int64_t* group
    const int64_t* defvalid
    const int64_t* elem
    const int64_t* tfirst
    const int64_t* tlen
    const int64_t* ftab
    const int64_t* oneof_next
    const int64_t* entry
    const int64_t* gfirst
    const int64_t* gcount
    const int64_t* gmembers
    Py_ssize_t* gsize
    Py_ssize_t* gcap
    uint64_t** v
    int64_t** l
    uint8_t** valid


cdef inline int _fail(Ctx* c, int code) noexcept nogil:
    c.err = code
    return -1


cdef inline int _varint(const uint8_t* p, Py_ssize_t* pos, Py_ssize_t end, uint64_t* out) noexcept nogil:
    """A varint of at most 10 bytes (bits past 64 dropped, as upb does); -1 when it does not end in them or before
    `end`."""
    cdef uint64_t acc = 0
    cdef uint64_t b
    cdef int i
    for i in range(10):
        if pos[0] >= end:
            return -1
        b = p[pos[0]]
        pos[0] += 1
        acc |= (b & 0x7F) << (7 * i)
        if not (b & 0x80):
            out[0] = acc
            return 0
    return -1


cdef inline int _tag(const uint8_t* p, Py_ssize_t* pos, Py_ssize_t end, uint64_t* out) noexcept nogil:
    """A tag: a varint of at most 5 bytes and 32 bits."""
    cdef Py_ssize_t start = pos[0]
    if _varint(p, pos, end, out):
        return -1
    if pos[0] - start > 5 or out[0] > <uint64_t>0xFFFFFFFFU:
        return -1
    return 0


cdef inline int _size(const uint8_t* p, Py_ssize_t* pos, Py_ssize_t end, Py_ssize_t* out) noexcept nogil:
    """A length: below 2**31 - 1 and within `end`."""
    cdef uint64_t n
    if _varint(p, pos, end, &n):
        return -1
    if n >= <uint64_t>INT32_LIMIT or <Py_ssize_t>n > end - pos[0]:
        return -1
    out[0] = <Py_ssize_t>n
    return 0


cdef inline void _init(Ctx* c, Py_ssize_t g, Py_ssize_t s) noexcept nogil:
    """Slot `s` of every node of group `g` at its default (a repeated field: empty, at its group's end)."""
    cdef Py_ssize_t k, m, e
    cdef int64_t kind
    for k in range(c.gfirst[g], c.gfirst[g] + c.gcount[g]):
        m = c.gmembers[k]
        c.valid[m][s] = <uint8_t>c.defvalid[m]
        kind = c.kind[m]
        if kind == K_MSG:
            continue
        if kind == K_LIST or kind == K_MAP:
            e = c.gsize[c.group[c.elem[m]]]
            c.v[m][s] = <uint64_t>e
            c.l[m][s] = e
            continue
        c.v[m][s] = 0
        if kind == K_STRING or kind == K_BYTES:
            c.l[m][s] = 0


cdef int _grow(Ctx* c, Py_ssize_t g, Py_ssize_t at_least=0) noexcept nogil:
    cdef Py_ssize_t cap = c.gcap[g] * 2 if c.gcap[g] else 64
    if cap < at_least:
        cap = at_least
    cdef Py_ssize_t k, m
    cdef int64_t kind
    cdef void* p
    for k in range(c.gfirst[g], c.gfirst[g] + c.gcount[g]):
        m = c.gmembers[k]
        kind = c.kind[m]
        if kind != K_MSG:  # a message has its validity only
            p = realloc(c.v[m], cap * 8)
            if p == NULL:
                return _fail(c, E_NOMEM)
            c.v[m] = <uint64_t*>p
        if kind == K_STRING or kind == K_BYTES or kind == K_LIST or kind == K_MAP:  # lengths, elements' ends
            p = realloc(c.l[m], cap * 8)
            if p == NULL:
                return _fail(c, E_NOMEM)
            c.l[m] = <int64_t*>p
        p = realloc(c.valid[m], cap)
        if p == NULL:
            return _fail(c, E_NOMEM)
        c.valid[m] = <uint8_t*>p
    c.gcap[g] = cap
    return 0


cdef inline Py_ssize_t _open(Ctx* c, Py_ssize_t g) noexcept nogil:
    """A new slot of group `g` (an element), at its defaults; -1 when out of memory."""
    cdef Py_ssize_t s = c.gsize[g]
    if s == c.gcap[g] and _grow(c, g):
        return -1
    _init(c, g, s)
    c.gsize[g] = s + 1
    return s


cdef int _skip(Ctx* c, int wt, uint64_t num, Py_ssize_t* pos, Py_ssize_t end, int depth, bint in_group=False) noexcept nogil:
    """Skip an unknown field's value (a group to its end-group tag), as upb does: field number 0 is malformed in a
    message, not inside an unknown group (upb skips a group's fields without looking at their numbers)."""
    cdef uint64_t x
    cdef Py_ssize_t n
    if wt == 0:
        if _varint(c.base, pos, c.stop, &x):
            return _fail(c, E_MALFORMED)
    elif wt == 1 or wt == 5:
        n = 8 if wt == 1 else 4
        if c.stop - pos[0] < n:
            return _fail(c, E_MALFORMED)
        pos[0] += n
    elif wt == 2:
        if _size(c.base, pos, c.stop, &n):
            return _fail(c, E_MALFORMED)
        pos[0] += n
    elif wt == 3:
        if pos[0] >= end or depth - 1 < 0:
            return _fail(c, E_MALFORMED)
        if _group(c, pos, end, depth - 1, num):
            return -1
    else:
        return _fail(c, E_MALFORMED)
    if num == 0 and not in_group:
        return _fail(c, E_MALFORMED)
    return 0


cdef int _group(Ctx* c, Py_ssize_t* pos, Py_ssize_t end, int depth, uint64_t num) noexcept nogil:
    """An unknown group's fields, to its end-group tag (the same number)."""
    cdef uint64_t tag
    while pos[0] < end:
        if _tag(c.base, pos, c.stop, &tag):
            return _fail(c, E_MALFORMED)
        if (tag & 7) == 4:
            if (tag >> 3) == num:
                return 0
            return _fail(c, E_MALFORMED)
        if _skip(c, <int>(tag & 7), tag >> 3, pos, end, depth, True):
            return -1
    return _fail(c, E_MALFORMED)  # its end (or past it) before its end-group tag


cdef inline int _wire(int64_t kind) noexcept nogil:
    if kind == K_VARINT:
        return 0
    if kind == K_FIX64:
        return 1
    if kind == K_FIX32:
        return 5
    return 2


cdef int _value(Ctx* c, Py_ssize_t node, Py_ssize_t s, Py_ssize_t* pos, Py_ssize_t end, int depth) noexcept nogil:
    """One value of `node` (its wire type checked by the caller) into slot `s`."""
    cdef int64_t k = c.kind[node]
    cdef uint64_t x = 0
    cdef uint32_t x32
    cdef Py_ssize_t n
    cdef int64_t mode
    if k == K_VARINT:
        if _varint(c.base, pos, c.stop, &x):
            return _fail(c, E_MALFORMED)
        mode = c.arg[node]
        if mode == M_INT32:
            x = <uint64_t><int64_t><int32_t><uint32_t>x
        elif mode == M_UINT32:
            x = <uint64_t><uint32_t>x
        elif mode == M_SINT32:
            x32 = <uint32_t>x
            x = <uint64_t><int64_t><int32_t>((x32 >> 1) ^ (0 - (x32 & 1)))
        elif mode == M_SINT64:
            x = (x >> 1) ^ (0 - (x & 1))
        elif mode == M_BOOL:
            x = x != 0
        c.v[node][s] = x
    elif k == K_FIX32 or k == K_FIX64:
        n = 4 if k == K_FIX32 else 8
        if c.stop - pos[0] < n:
            return _fail(c, E_MALFORMED)
        memcpy(&x, c.base + pos[0], n)
        pos[0] += n
        c.v[node][s] = x
    elif k == K_STRING or k == K_BYTES:
        if _size(c.base, pos, c.stop, &n):
            return _fail(c, E_MALFORMED)
        if k == K_STRING and not valid_utf8(c.base + pos[0], n):
            return _fail(c, E_UTF8)
        c.v[node][s] = <uint64_t>pos[0]
        c.l[node][s] = n
        pos[0] += n
    else:  # K_MSG
        if _size(c.base, pos, c.stop, &n):
            return _fail(c, E_MALFORMED)
        if n > end - pos[0] or depth - 1 < 0:  # upb limits a message (not a string) to its parent's end at once
            return _fail(c, E_MALFORMED)
        c.valid[node][s] = 1  # before its fields: a map entry's unknown field unsets it
        if _msg(c, node, s, pos[0], pos[0] + n, depth - 1):
            return -1
        pos[0] += n
        return 0
    c.valid[node][s] = 1
    return 0


cdef int _msg(Ctx* c, Py_ssize_t node, Py_ssize_t s, Py_ssize_t pos, Py_ssize_t end, int depth) noexcept nogil:
    """The fields of a message (`node`, slot `s`) in bytes [pos, end)."""
    cdef uint64_t tag, num
    cdef int wt, we
    cdef Py_ssize_t child, elem, g, e, n, stop, other
    cdef int64_t k, ek
    while pos != end:
        if pos > end:  # the last field ran past the message's end (upb reads it, then finds it past)
            return _fail(c, E_MALFORMED)
        if _tag(c.base, &pos, c.stop, &tag):
            return _fail(c, E_MALFORMED)
        num = tag >> 3
        wt = <int>(tag & 7)
        if wt == 4:  # an end-group tag outside a group
            return _fail(c, E_MALFORMED)
        child = -1
        if num < <uint64_t>c.tlen[node]:
            child = c.ftab[c.tfirst[node] + num]
        if child < 0:
            if _skip(c, wt, num, &pos, end, depth):
                return -1
            if c.entry[node]:
                c.valid[node][s] = 0  # upb keeps a map entry with unknown fields out of the map
            continue
        k = c.kind[child]
        if k == K_LIST:
            elem = c.elem[child]
            ek = c.kind[elem]
            g = c.group[elem]
            we = _wire(ek)
            if wt == we:
                e = _open(c, g)
                if e < 0 or _value(c, elem, e, &pos, end, depth):
                    return -1
            elif wt == 2 and (ek == K_VARINT or ek == K_FIX32 or ek == K_FIX64):  # packed
                if _size(c.base, &pos, c.stop, &n):
                    return _fail(c, E_MALFORMED)
                stop = pos + n
                if ek != K_VARINT and n % (4 if ek == K_FIX32 else 8):
                    return _fail(c, E_MALFORMED)
                while pos < stop:
                    e = _open(c, g)
                    if e < 0 or _value(c, elem, e, &pos, stop, depth):
                        return -1
                if pos > stop:
                    return _fail(c, E_MALFORMED)
            else:
                if _skip(c, wt, num, &pos, end, depth):
                    return -1
                if c.entry[node]:
                    c.valid[node][s] = 0
                continue
            c.l[child][s] = c.gsize[g]
            continue
        if k == K_MAP:
            if wt != 2:
                if _skip(c, wt, num, &pos, end, depth):
                    return -1
                if c.entry[node]:
                    c.valid[node][s] = 0
                continue
            elem = c.elem[child]
            g = c.group[elem]
            e = _open(c, g)
            if e < 0 or _value(c, elem, e, &pos, end, depth):
                return -1
            c.l[child][s] = c.gsize[g]
            continue
        if wt != _wire(k):
            if _skip(c, wt, num, &pos, end, depth):
                return -1
            if c.entry[node]:
                c.valid[node][s] = 0
            continue
        other = c.oneof_next[child]
        while other >= 0 and other != child:  # a oneof member: the others are unset
            if c.valid[other][s]:
                if c.kind[other] == K_MSG:
                    return _fail(c, E_DEFER)  # upb starts that member afresh if it comes again
                c.valid[other][s] = 0
            other = c.oneof_next[other]
        if _value(c, child, s, &pos, end, depth):
            return -1
    return 0


cdef object _hand(void** block, Py_ssize_t m, Py_ssize_t itemsize, char* fmt):
    """The first `m` items of a malloc'd block as a buffer that frees it (no copy); the block is the buffer's now."""
    if m == 0 or block[0] == NULL:
        return b""
    cdef cvarray out = cvarray(shape=(m,), itemsize=itemsize, format=fmt, mode="c", allocate_buffer=False)
    out.data = <char*>block[0]
    out.callback_free_data = free
    block[0] = NULL
    return out


def decode(
    const uint8_t[::1] data,
    const int64_t[::1] starts,
    const int64_t[::1] ends,
    const uint8_t[::1] eligible,
    const int64_t[::1] kind,
    const int64_t[::1] arg,
    const int64_t[::1] group,
    const int64_t[::1] defvalid,
    const int64_t[::1] elem,
    const int64_t[::1] tfirst,
    const int64_t[::1] tlen,
    const int64_t[::1] ftab,
    const int64_t[::1] oneof_next,
    const int64_t[::1] entry,
    const int64_t[::1] gfirst,
    const int64_t[::1] gcount,
    const int64_t[::1] gmembers,
    int8_t[::1] codes,
):
    """Decode the eligible rows; a bad one (or one handed back) gets its code in `codes` and null columns.

    Returns per group its slot count, and per node (valid, values, ends) as buffers: uint8 per slot; uint64 per
    slot for a scalar, its elements' start for a repeated field or map (else empty); int64 per slot, its elements'
    end for a repeated field or map (else empty); for a string or bytes node (valid, int32 offsets, its bytes). None when a
    string or bytes column would pass 2 GiB (int32 offsets): nothing of the batch is then usable."""
    cdef Py_ssize_t n = starts.shape[0]
    cdef Py_ssize_t nodes = kind.shape[0]
    cdef Py_ssize_t groups = gfirst.shape[0]
    cdef Py_ssize_t i, j, s, total, m
    cdef Ctx c
    cdef Py_ssize_t* saved
    cdef int32_t* offs
    cdef char* buf
    memset(&c, 0, sizeof(Ctx))
    c.base = &data[0] if data.shape[0] else NULL
    c.kind = &kind[0]
    c.arg = &arg[0]
    c.group = &group[0]
    c.defvalid = &defvalid[0]
    c.elem = &elem[0]
    c.tfirst = &tfirst[0]
    c.tlen = &tlen[0]
    c.ftab = &ftab[0] if ftab.shape[0] else NULL
    c.oneof_next = &oneof_next[0]
    c.entry = &entry[0]
    c.gfirst = &gfirst[0]
    c.gcount = &gcount[0]
    c.gmembers = &gmembers[0]
    c.gsize = <Py_ssize_t*>PyMem_Malloc(groups * sizeof(Py_ssize_t))
    c.gcap = <Py_ssize_t*>PyMem_Malloc(groups * sizeof(Py_ssize_t))
    saved = <Py_ssize_t*>PyMem_Malloc(groups * sizeof(Py_ssize_t))
    c.v = <uint64_t**>PyMem_Malloc(nodes * sizeof(uint64_t*))
    c.l = <int64_t**>PyMem_Malloc(nodes * sizeof(int64_t*))
    c.valid = <uint8_t**>PyMem_Malloc(nodes * sizeof(uint8_t*))
    if not (c.gsize and c.gcap and saved and c.v and c.l and c.valid):
        PyMem_Free(c.gsize); PyMem_Free(c.gcap); PyMem_Free(saved)
        PyMem_Free(c.v); PyMem_Free(c.l); PyMem_Free(c.valid)
        raise MemoryError()
    for j in range(nodes):
        c.v[j] = NULL
        c.l[j] = NULL
        c.valid[j] = NULL
    for j in range(groups):
        c.gsize[j] = 0
        c.gcap[j] = 0
    try:
        with nogil:
            _grow(&c, 0, n)  # the rows' group at its size at once
            for i in range(n):
                if c.err == E_NOMEM:
                    break
                for j in range(1, groups):
                    saved[j] = c.gsize[j]
                s = _open(&c, 0)
                c.err = 0
                if eligible[i]:
                    c.stop = ends[i]
                    if _msg(&c, 0, s, starts[i], ends[i], MAX_DEPTH) == 0:
                        continue
                if c.err == E_NOMEM:
                    break
                codes[i] = <int8_t>c.err  # 0: not eligible
                for j in range(1, groups):
                    c.gsize[j] = saved[j]
                _init(&c, 0, s)
                c.valid[0][s] = 0  # the row is null (its fields at their defaults, as Arrow fills a null struct)
        if c.err == E_NOMEM:
            raise MemoryError()
        sizes = [c.gsize[j] for j in range(groups)]
        out = []
        for j in range(nodes):
            m = c.gsize[group[j]]
            valid = _hand(<void**>&c.valid[j], m, 1, b"B")
            if kind[j] == K_STRING or kind[j] == K_BYTES:
                total = 0
                for s in range(m):
                    total += c.l[j][s]
                if total > INT32_LIMIT:
                    return None
                offsets = PyBytes_FromStringAndSize(NULL, (m + 1) * 4)
                offs = <int32_t*><char*>offsets
                chars = PyBytes_FromStringAndSize(NULL, total)
                buf = <char*>chars
                offs[0] = 0
                total = 0
                for s in range(m):
                    if c.l[j][s]:
                        memcpy(buf + total, c.base + <Py_ssize_t>c.v[j][s], c.l[j][s])
                        total += c.l[j][s]
                    offs[s + 1] = <int32_t>total
                out.append((valid, offsets, chars))
            elif kind[j] != K_MSG:
                values = _hand(<void**>&c.v[j], m, 8, b"Q")
                if kind[j] == K_LIST or kind[j] == K_MAP:
                    out.append((valid, values, _hand(<void**>&c.l[j], m, 8, b"q")))
                else:
                    out.append((valid, values, b""))
            else:
                out.append((valid, b"", b""))
        return sizes, out
    finally:
        for j in range(nodes):
            free(c.v[j])
            free(c.l[j])
            free(c.valid[j])
        PyMem_Free(c.gsize); PyMem_Free(c.gcap); PyMem_Free(saved)
        PyMem_Free(c.v); PyMem_Free(c.l); PyMem_Free(c.valid)
