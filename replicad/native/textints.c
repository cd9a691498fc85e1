/*
 * Plain decimal integer texts of an Arrow binary/string column parsed in one pass.
 *
 * Python API (module replicad.native._textints):
 *   parse(offsets, data, validity, offset, n, signed) -> bytes | int
 *       offsets, data, validity: the buffers of an Arrow `binary`/`string` array (int32 offsets; validity
 *       may be None) and offset/n its slice.  Every valid row must be one or more ASCII digits, with one
 *       leading '-' allowed when `signed`, and fit 64 bits (int64 when signed, else uint64).  Returns n
 *       little-endian 8-byte values (0 under null rows), or the index of the first valid row that is not
 *       such a text (signs '+', spaces, overflow, anything else): the caller's general path deals with it.
 * ValueError for buffers inconsistent with offset/n.  The GIL is released while parsing.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* -1 = all rows fine, else the first row that is not a plain integer */
static Py_ssize_t parse_rows(const int32_t *off, const uint8_t *data, const uint8_t *validity,
                             Py_ssize_t offset, Py_ssize_t n, int is_signed, uint64_t *out) {
    for (Py_ssize_t r = 0; r < n; r++) {
        Py_ssize_t k = offset + r;
        if (validity && !((validity[k >> 3] >> (k & 7)) & 1)) {
            out[r] = 0;
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
            if (neg ? v > (uint64_t)INT64_MAX + 1 : v > (uint64_t)INT64_MAX)
                return r;
            out[r] = neg ? (uint64_t)0 - v : v;
        } else {
            out[r] = v;
        }
    }
    return -1;
}

static PyObject *py_parse(PyObject *self, PyObject *args) {
    Py_buffer ob, db, vb;
    PyObject *vobj;
    Py_ssize_t offset, n;
    int is_signed;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*Onnp", &ob, &db, &vobj, &offset, &n, &is_signed))
        return NULL;
    int has_validity = vobj != Py_None;
    if (has_validity && PyObject_GetBuffer(vobj, &vb, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&ob);
        PyBuffer_Release(&db);
        return NULL;
    }
    PyObject *result = NULL, *values = NULL;
    const int32_t *off = (const int32_t *)ob.buf;
    if (offset < 0 || n < 0 || (offset + n + 1) * 4 > ob.len ||
        (has_validity && (offset + n + 7) / 8 > vb.len)) {
        PyErr_SetString(PyExc_ValueError, "buffers too short for offset and length");
        goto done;
    }
    if (((uintptr_t)ob.buf) % 4) {
        PyErr_SetString(PyExc_ValueError, "offsets buffer is not 4-byte aligned");
        goto done;
    }
    for (Py_ssize_t k = offset; k < offset + n; k++) {
        if (off[k] < 0 || off[k + 1] < off[k] || off[k + 1] > db.len) {
            PyErr_Format(PyExc_ValueError, "offset %zd out of order or outside the %zd-byte data", k + 1,
                         db.len);
            goto done;
        }
    }
    values = PyBytes_FromStringAndSize(NULL, n * 8);
    if (!values)
        goto done;
    Py_ssize_t bad;
    uint64_t *out = (uint64_t *)PyBytes_AS_STRING(values);
    const uint8_t *vbits = has_validity ? (const uint8_t *)vb.buf : NULL;
    Py_BEGIN_ALLOW_THREADS
    bad = parse_rows(off, (const uint8_t *)db.buf, vbits, offset, n, is_signed, out);
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
     "parse(offsets, data, validity, offset, n, signed) -> 8-byte values | first row not a plain integer."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_textints", "Plain decimal integer texts parsed to 64-bit values.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__textints(void) {
    return PyModule_Create(&module_def);
}
