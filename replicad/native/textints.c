/*
 * Plain decimal integer texts of an Arrow binary/string column parsed in one pass.
 *
 * Python API (module replicad.native._textints):
 *   parse(offsets, data, validity, offset, n, signed, bits) -> bytes | int
 *       offsets, data, validity: the buffers of an Arrow `binary`/`string` array (int32 offsets; validity
 *       may be None) and offset/n its slice.  Every valid row must be one or more ASCII digits, with one
 *       leading '-' allowed when `signed`, and fit the `bits`-bit (8, 16, 32, 64) signed or unsigned type.
 *       Returns n little-endian values of bits/8 bytes (0 under null rows), or the index of the first
 *       valid row that is not such a text (signs '+', spaces, out of range, anything else): the caller's
 *       general path deals with it (and words the error).
 * ValueError for buffers inconsistent with offset/n.  The GIL is released while parsing.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "string_offsets.h"

/* -1 = all rows fine, else the first row that is not a plain integer */
static inline void store(uint8_t *out, Py_ssize_t r, int bytes, uint64_t v) {
    switch (bytes) {
    case 1: out[r] = (uint8_t)v; break;
    case 2: { uint16_t x = (uint16_t)v; memcpy(out + 2 * r, &x, 2); break; }
    case 4: { uint32_t x = (uint32_t)v; memcpy(out + 4 * r, &x, 4); break; }
    default: memcpy(out + 8 * r, &v, 8); break;
    }
}

static Py_ssize_t parse_rows(const int32_t *off, const uint8_t *data, const uint8_t *validity,
                             Py_ssize_t offset, Py_ssize_t n, int is_signed, int bits, uint8_t *out) {
    int bytes = bits / 8;
    /* the largest magnitude allowed: unsigned 2^bits - 1; signed 2^(bits-1) - 1, one more when negative */
    uint64_t umax = bits == 64 ? UINT64_MAX : ((uint64_t)1 << bits) - 1;
    uint64_t smax = ((uint64_t)1 << (bits - 1)) - 1;
    for (Py_ssize_t r = 0; r < n; r++) {
        Py_ssize_t k = offset + r;
        if (validity && !((validity[k >> 3] >> (k & 7)) & 1)) {
            store(out, r, bytes, 0);
            continue;
        }
        const uint8_t *s = data + off[k];
        Py_ssize_t len = (Py_ssize_t)off[k + 1] - off[k], i = 0;
        int neg = 0;
        if (is_signed && len > 0 && s[0] == '-') {
            neg = 1;
            i = 1;
        }
        if (i >= len || len - i > 20)
            return r;
        uint64_t v = 0;
        for (; i < len; i++) {
            unsigned d = (unsigned)s[i] - '0';
            if (d > 9)
                return r;
            if (v > (UINT64_MAX - d) / 10)
                return r; /* beyond 64 bits */
            v = v * 10 + d;
        }
        if (is_signed) {
            if (neg ? v > smax + 1 : v > smax)
                return r;
            store(out, r, bytes, neg ? (uint64_t)0 - v : v);
        } else {
            if (v > umax)
                return r;
            store(out, r, bytes, v);
        }
    }
    return -1;
}

static PyObject *py_parse(PyObject *self, PyObject *args) {
    Py_buffer ob, db, vb;
    PyObject *vobj;
    Py_ssize_t offset, n;
    int is_signed, bits;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*Onnpi", &ob, &db, &vobj, &offset, &n, &is_signed, &bits))
        return NULL;
    if (bits != 8 && bits != 16 && bits != 32 && bits != 64) {
        PyBuffer_Release(&ob);
        PyBuffer_Release(&db);
        PyErr_SetString(PyExc_ValueError, "bits must be 8, 16, 32 or 64");
        return NULL;
    }
    int has_validity = vobj != Py_None;
    if (has_validity && PyObject_GetBuffer(vobj, &vb, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&ob);
        PyBuffer_Release(&db);
        return NULL;
    }
    PyObject *result = NULL, *values = NULL;
    const int32_t *off = (const int32_t *)ob.buf;
    if (check_string_buffers(&ob, &db, &vb, has_validity, offset, n) < 0)
        goto done;
    values = PyBytes_FromStringAndSize(NULL, n * (bits / 8));
    if (!values)
        goto done;
    Py_ssize_t bad;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(values);
    const uint8_t *vbits = has_validity ? (const uint8_t *)vb.buf : NULL;
    Py_BEGIN_ALLOW_THREADS
    bad = parse_rows(off, (const uint8_t *)db.buf, vbits, offset, n, is_signed, bits, out);
    Py_END_ALLOW_THREADS
    if (bad >= 0) {
        result = PyLong_FromSsize_t(bad);
        goto done;
    }
    result = Py_NewRef(values);
done:
    Py_XDECREF(values);
    PyBuffer_Release(&ob);
    PyBuffer_Release(&db);
    if (has_validity)
        PyBuffer_Release(&vb);
    return result;
}

static PyMethodDef module_methods[] = {
    {"parse", py_parse, METH_VARARGS,
     "parse(offsets, data, validity, offset, n, signed, bits) -> values | first row not a plain integer."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_textints", "Plain decimal integer texts parsed to 8- to 64-bit values.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__textints(void) {
    return PyModule_Create(&module_def);
}
