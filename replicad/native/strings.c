/*
 * ClickHouse "String" column streams: every row is a VarUInt length (LEB128, 7 bits per byte, low
 * group first, 0x80 = more bytes follow) followed by that many raw bytes.
 *
 * Python API (module replicad.native._strings):
 *   decode(buf, n_rows) -> (offsets: bytes, data: bytes, consumed: int)
 *       Reads the first n_rows records of buf.  offsets holds n_rows + 1 little-endian offsets into
 *       data (int32 when the payload total is below 2**31, else int64 -- tell them apart by
 *       len(offsets)); data is the concatenated payloads (copied once); consumed is the number of
 *       bytes of buf the records occupy.  Ready for pa.Array.from_buffers(pa.binary() or
 *       pa.large_binary(), n_rows, [None, offsets, data]).
 *   records(buf, n_rows) -> (offsets: bytes, consumed: int)
 *       Where the first n_rows records of buf start: n_rows + 1 little-endian offsets into buf (int32
 *       when consumed is below 2**31, else int64), the last one = consumed.  Record i is
 *       buf[offsets[i]:offsets[i+1]], its VarUInt length included: ready for pa.Array.from_buffers(
 *       pa.binary() or pa.large_binary(), n_rows, [None, offsets, buf]) -- the rows still serialized.
 *   encode(offsets, data) -> bytes
 *       offsets: a 1-d int32 or int64 array of n + 1 non-decreasing positions inside data (need not
 *       start at 0); returns the stream of the n strings data[offsets[i]:offsets[i+1]].
 *   encode_take(offsets, data, indices) -> bytes
 *       The stream of the strings data[offsets[i]:offsets[i+1]] for i in indices (a 1-d int64 array), in
 *       that order: encode() of the rows permuted by indices, without the permuted copy.
 * All raise ValueError for anything inconsistent (truncated stream, a length running past the end,
 * a VarUInt longer than 10 bytes, offsets out of order or outside data) and never read outside the
 * given buffers.  The GIL is released while working on large inputs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define GIL_THRESHOLD 65536
#define VARUINT_MAX_BYTES 10

enum { DEC_OK = 0, DEC_TRUNCATED_HEADER, DEC_OVERLONG_HEADER, DEC_PAYLOAD_PAST_END };

typedef struct {
    int status;
    Py_ssize_t row;      /* the failing row */
    uint64_t length;     /* its declared length (DEC_PAYLOAD_PAST_END) */
    Py_ssize_t at;       /* position of its header */
    Py_ssize_t consumed; /* bytes used by all rows (DEC_OK) */
    uint64_t payload;    /* total payload bytes (DEC_OK) */
} scan_result;

/* Reads one VarUInt at *pos (pos < size); advances *pos.  Returns a DEC_* status. */
static inline int read_varuint(const uint8_t *buf, Py_ssize_t size, Py_ssize_t *pos, uint64_t *value) {
    Py_ssize_t p = *pos;
    uint8_t b = buf[p];
    if (b < 0x80) {
        *value = b;
        *pos = p + 1;
        return DEC_OK;
    }
    uint64_t v = b & 0x7F;
    for (int i = 1; i < VARUINT_MAX_BYTES; i++) {
        if (++p >= size)
            return DEC_TRUNCATED_HEADER;
        b = buf[p];
        v |= (uint64_t)(b & 0x7F) << (7 * i); /* the 10th byte contributes bit 63 only */
        if (b < 0x80) {
            *value = v;
            *pos = p + 1;
            return DEC_OK;
        }
    }
    return DEC_OVERLONG_HEADER;
}

/* Walks n records.  With out_offsets/out_data set, also writes the offsets (width 4 or 8) and the
 * payloads; the first walk has already validated everything then. */
static void scan(const uint8_t *buf, Py_ssize_t size, Py_ssize_t n, scan_result *r, void *out_offsets,
                 int width, uint8_t *out_data) {
    Py_ssize_t pos = 0;
    uint64_t total = 0;
    int32_t *off32 = width == 4 ? (int32_t *)out_offsets : NULL;
    int64_t *off64 = width == 8 ? (int64_t *)out_offsets : NULL;
    if (off32)
        off32[0] = 0;
    if (off64)
        off64[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t len;
        r->row = i;
        r->at = pos;
        if (pos >= size) {
            r->status = DEC_TRUNCATED_HEADER;
            return;
        }
        int st = read_varuint(buf, size, &pos, &len);
        if (st != DEC_OK) {
            r->status = st;
            return;
        }
        if (len > (uint64_t)(size - pos)) {
            r->status = DEC_PAYLOAD_PAST_END;
            r->length = len;
            return;
        }
        if (out_data) {
            memcpy(out_data + total, buf + pos, (size_t)len);
            if (off32)
                off32[i + 1] = (int32_t)(total + len);
            else
                off64[i + 1] = (int64_t)(total + len);
        }
        total += len;
        pos += (Py_ssize_t)len;
    }
    r->status = DEC_OK;
    r->consumed = pos;
    r->payload = total;
}

/* Writes the start of every one of n records (already validated by scan) and the end of the last. */
static void record_starts(const uint8_t *buf, Py_ssize_t size, Py_ssize_t n, void *out_offsets, int width) {
    Py_ssize_t pos = 0;
    int32_t *off32 = width == 4 ? (int32_t *)out_offsets : NULL;
    int64_t *off64 = width == 8 ? (int64_t *)out_offsets : NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t len = 0;
        if (off32)
            off32[i] = (int32_t)pos;
        else
            off64[i] = (int64_t)pos;
        read_varuint(buf, size, &pos, &len);
        pos += (Py_ssize_t)len;
    }
    if (off32)
        off32[n] = (int32_t)pos;
    else
        off64[n] = (int64_t)pos;
}

static PyObject *decode_error(const scan_result *r, Py_ssize_t n, Py_ssize_t size) {
    switch (r->status) {
    case DEC_TRUNCATED_HEADER:
        if (r->at >= size)
            return PyErr_Format(PyExc_ValueError, "stream of %zd bytes holds fewer than %zd rows (ends at row %zd)",
                                size, n, r->row);
        return PyErr_Format(PyExc_ValueError, "length of row %zd (at byte %zd) is cut off by the end of the "
                            "%zd-byte stream", r->row, r->at, size);
    case DEC_OVERLONG_HEADER:
        return PyErr_Format(PyExc_ValueError, "length of row %zd (at byte %zd) is a VarUInt longer than %d bytes",
                            r->row, r->at, VARUINT_MAX_BYTES);
    default:
        return PyErr_Format(PyExc_ValueError, "row %zd (at byte %zd) declares %llu bytes, past the end of the "
                            "%zd-byte stream", r->row, r->at, (unsigned long long)r->length, size);
    }
}

/* The checks and the first scan both decoders start with: the row count against the stream, then every
 * record's length (without the GIL for a big stream).  0, or -1 with ValueError set. */
static int first_pass(const uint8_t *buf, Py_ssize_t size, Py_ssize_t n, scan_result *r, int big) {
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "negative row count");
        return -1;
    }
    if (n > size) { /* every record takes at least one byte: also bounds the allocations that follow */
        PyErr_Format(PyExc_ValueError, "stream of %zd bytes holds fewer than %zd rows", size, n);
        return -1;
    }
    if (big) {
        Py_BEGIN_ALLOW_THREADS
        scan(buf, size, n, r, NULL, 0, NULL);
        Py_END_ALLOW_THREADS
    } else {
        scan(buf, size, n, r, NULL, 0, NULL);
    }
    if (r->status != DEC_OK) {
        decode_error(r, n, size);
        return -1;
    }
    return 0;
}

static PyObject *py_decode(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t n;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*n", &b, &n))
        return NULL;
    const uint8_t *buf = (const uint8_t *)b.buf;
    Py_ssize_t size = b.len;
    PyObject *offsets = NULL, *data = NULL, *result = NULL;
    scan_result r;
    memset(&r, 0, sizeof r);
    int big = size >= GIL_THRESHOLD;
    if (first_pass(buf, size, n, &r, big) < 0)
        goto done;
    int width = r.payload < ((uint64_t)1 << 31) ? 4 : 8;
    offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * width);
    data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)r.payload);
    if (!offsets || !data)
        goto done;
    void *op = PyBytes_AS_STRING(offsets);
    uint8_t *dp = (uint8_t *)PyBytes_AS_STRING(data);
    if (big) {
        Py_BEGIN_ALLOW_THREADS
        scan(buf, size, n, &r, op, width, dp);
        Py_END_ALLOW_THREADS
    } else {
        scan(buf, size, n, &r, op, width, dp);
    }
    result = Py_BuildValue("(OOn)", offsets, data, r.consumed);
done:
    Py_XDECREF(offsets);
    Py_XDECREF(data);
    PyBuffer_Release(&b);
    return result;
}

static inline Py_ssize_t varuint_size(uint64_t v) {
    Py_ssize_t k = 1;
    while (v >= 0x80) {
        v >>= 7;
        k++;
    }
    return k;
}

static inline int64_t offset_at(const void *offsets, int width, Py_ssize_t i) {
    if (width == 4) {
        int32_t v;
        memcpy(&v, (const char *)offsets + i * 4, 4);
        return v;
    }
    int64_t v;
    memcpy(&v, (const char *)offsets + i * 8, 8);
    return v;
}

/* Validates offsets against data_len; returns the output size, or -1 - (index of the bad offset). */
static Py_ssize_t encoded_size(const void *offsets, int width, Py_ssize_t n, Py_ssize_t data_len) {
    int64_t prev = offset_at(offsets, width, 0);
    if (prev < 0 || prev > data_len)
        return -1;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 1; i <= n; i++) {
        int64_t cur = offset_at(offsets, width, i);
        if (cur < prev || cur > data_len)
            return -1 - i;
        total += varuint_size((uint64_t)(cur - prev));
        prev = cur;
    }
    return total + (Py_ssize_t)(prev - offset_at(offsets, width, 0));
}

static void encode_into(const void *offsets, int width, Py_ssize_t n, const uint8_t *data, uint8_t *out) {
    int64_t prev = offset_at(offsets, width, 0);
    for (Py_ssize_t i = 1; i <= n; i++) {
        int64_t cur = offset_at(offsets, width, i);
        uint64_t len = (uint64_t)(cur - prev);
        while (len >= 0x80) {
            *out++ = (uint8_t)(len | 0x80);
            len >>= 7;
        }
        *out++ = (uint8_t)len;
        memcpy(out, data + prev, (size_t)(cur - prev));
        out += cur - prev;
        prev = cur;
    }
}

static PyObject *py_encode(PyObject *self, PyObject *args) {
    PyObject *off_obj;
    Py_buffer ob, db;
    (void)self;
    if (!PyArg_ParseTuple(args, "Oy*", &off_obj, &db))
        return NULL;
    if (PyObject_GetBuffer(off_obj, &ob, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&db);
        return NULL;
    }
    PyObject *result = NULL;
    const char *fmt = ob.format ? ob.format : "B";
    if (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@')
        fmt++;
    int width = (int)ob.itemsize;
    int signed_int = fmt[0] == 'i' || fmt[0] == 'l' || fmt[0] == 'q';
    if (ob.ndim != 1 || !signed_int || (width != 4 && width != 8) || fmt[1] != '\0') {
        PyErr_SetString(PyExc_ValueError, "offsets must be a 1-d int32 or int64 array");
        goto done;
    }
    Py_ssize_t n = ob.len / width - 1;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "offsets must hold at least one value");
        goto done;
    }
    int big = n >= GIL_THRESHOLD / 8 || db.len >= GIL_THRESHOLD;
    Py_ssize_t total;
    if (big) {
        Py_BEGIN_ALLOW_THREADS
        total = encoded_size(ob.buf, width, n, db.len);
        Py_END_ALLOW_THREADS
    } else {
        total = encoded_size(ob.buf, width, n, db.len);
    }
    if (total < 0) {
        Py_ssize_t i = -1 - total;
        PyErr_Format(PyExc_ValueError, "offset %zd (%lld) is out of order or outside the %zd-byte data", i,
                     (long long)offset_at(ob.buf, width, i), db.len);
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, total);
    if (!result)
        goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
    if (big) {
        Py_BEGIN_ALLOW_THREADS
        encode_into(ob.buf, width, n, (const uint8_t *)db.buf, out);
        Py_END_ALLOW_THREADS
    } else {
        encode_into(ob.buf, width, n, (const uint8_t *)db.buf, out);
    }
done:
    PyBuffer_Release(&ob);
    PyBuffer_Release(&db);
    return result;
}

/* Size of the stream of rows idx[0..m) of (offsets, data): -1 - k when idx[k] or its offsets are bad. */
static Py_ssize_t taken_size(const void *offsets, int width, Py_ssize_t n, Py_ssize_t data_len,
                             const int64_t *idx, Py_ssize_t m) {
    Py_ssize_t total = 0;
    for (Py_ssize_t k = 0; k < m; k++) {
        int64_t i = idx[k];
        if (i < 0 || i >= n)
            return -1 - k;
        int64_t a = offset_at(offsets, width, i), b = offset_at(offsets, width, i + 1);
        if (a < 0 || b < a || b > data_len)
            return -1 - k;
        total += varuint_size((uint64_t)(b - a)) + (Py_ssize_t)(b - a);
    }
    return total;
}

static void encode_taken(const void *offsets, int width, const uint8_t *data, const int64_t *idx,
                         Py_ssize_t m, uint8_t *out) {
    for (Py_ssize_t k = 0; k < m; k++) {
        int64_t a = offset_at(offsets, width, idx[k]), b = offset_at(offsets, width, idx[k] + 1);
        uint64_t len = (uint64_t)(b - a);
        while (len >= 0x80) {
            *out++ = (uint8_t)(len | 0x80);
            len >>= 7;
        }
        *out++ = (uint8_t)len;
        memcpy(out, data + a, (size_t)(b - a));
        out += b - a;
    }
}

static PyObject *py_encode_take(PyObject *self, PyObject *args) {
    PyObject *off_obj, *idx_obj;
    Py_buffer ob, db, ib;
    (void)self;
    if (!PyArg_ParseTuple(args, "Oy*O", &off_obj, &db, &idx_obj))
        return NULL;
    if (PyObject_GetBuffer(off_obj, &ob, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&db);
        return NULL;
    }
    if (PyObject_GetBuffer(idx_obj, &ib, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&ob);
        PyBuffer_Release(&db);
        return NULL;
    }
    PyObject *result = NULL;
    const char *fmt = ob.format ? ob.format : "B";
    if (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@')
        fmt++;
    int width = (int)ob.itemsize;
    int signed_int = fmt[0] == 'i' || fmt[0] == 'l' || fmt[0] == 'q';
    if (ob.ndim != 1 || !signed_int || (width != 4 && width != 8) || fmt[1] != '\0') {
        PyErr_SetString(PyExc_ValueError, "offsets must be a 1-d int32 or int64 array");
        goto done;
    }
    const char *ifmt = ib.format ? ib.format : "B";
    if (ifmt[0] == '<' || ifmt[0] == '=' || ifmt[0] == '@')
        ifmt++;
    if (ib.ndim != 1 || ib.itemsize != 8 || (ifmt[0] != 'l' && ifmt[0] != 'q') || ifmt[1] != '\0') {
        PyErr_SetString(PyExc_ValueError, "indices must be a 1-d int64 array");
        goto done;
    }
    Py_ssize_t n = ob.len / width - 1, m = ib.len / 8;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "offsets must hold at least one value");
        goto done;
    }
    const int64_t *idx = (const int64_t *)ib.buf;
    int big = m >= GIL_THRESHOLD / 8;
    Py_ssize_t total;
    if (big) {
        Py_BEGIN_ALLOW_THREADS
        total = taken_size(ob.buf, width, n, db.len, idx, m);
        Py_END_ALLOW_THREADS
    } else {
        total = taken_size(ob.buf, width, n, db.len, idx, m);
    }
    if (total < 0) {
        Py_ssize_t k = -1 - total;
        PyErr_Format(PyExc_ValueError, "index %lld (at %zd) is outside the %zd rows or its offsets are bad",
                     (long long)idx[k], k, n);
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, total);
    if (!result)
        goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
    if (big || total >= GIL_THRESHOLD) {
        Py_BEGIN_ALLOW_THREADS
        encode_taken(ob.buf, width, (const uint8_t *)db.buf, idx, m, out);
        Py_END_ALLOW_THREADS
    } else {
        encode_taken(ob.buf, width, (const uint8_t *)db.buf, idx, m, out);
    }
done:
    PyBuffer_Release(&ob);
    PyBuffer_Release(&db);
    PyBuffer_Release(&ib);
    return result;
}

static PyObject *py_records(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t n;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*n", &b, &n))
        return NULL;
    const uint8_t *buf = (const uint8_t *)b.buf;
    Py_ssize_t size = b.len;
    PyObject *offsets = NULL, *result = NULL;
    scan_result r;
    memset(&r, 0, sizeof r);
    int big = size >= GIL_THRESHOLD;
    if (first_pass(buf, size, n, &r, big) < 0)
        goto done;
    int width = r.consumed < ((Py_ssize_t)1 << 31) ? 4 : 8;
    offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * width);
    if (!offsets)
        goto done;
    void *op = PyBytes_AS_STRING(offsets);
    if (big) {
        Py_BEGIN_ALLOW_THREADS
        record_starts(buf, size, n, op, width);
        Py_END_ALLOW_THREADS
    } else {
        record_starts(buf, size, n, op, width);
    }
    result = Py_BuildValue("(On)", offsets, r.consumed);
done:
    Py_XDECREF(offsets);
    PyBuffer_Release(&b);
    return result;
}

static PyMethodDef module_methods[] = {
    {"records", py_records, METH_VARARGS,
     "records(buf, n_rows) -> (offsets, consumed): where the first n_rows VarUInt-prefixed records start."},
    {"decode", py_decode, METH_VARARGS,
     "decode(buf, n_rows) -> (offsets, data, consumed): the first n_rows VarUInt-prefixed strings of buf."},
    {"encode", py_encode, METH_VARARGS,
     "encode(offsets, data) -> bytes: VarUInt length + bytes of each data[offsets[i]:offsets[i+1]]."},
    {"encode_take", py_encode_take, METH_VARARGS,
     "encode_take(offsets, data, indices) -> bytes: encode() of the rows indices[0], indices[1], ..."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_strings", "ClickHouse String column streams (VarUInt length + bytes).", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__strings(void) {
    return PyModule_Create(&module_def);
}
