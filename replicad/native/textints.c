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
 *   dates(offsets, data, offset, n, with_time) -> bytes | None
 *       Rows (no nulls) that are all `YYYY-MM-DD` (with_time: `YYYY-MM-DD hh:mm:ss`, 'T' allowed for the
 *       space) with years 1900..2299, real calendar days, hh < 24, mm and ss < 60: n little-endian int64
 *       days since 1970-01-01 (with_time: local seconds since then); None when some row is not (the
 *       numpy path of dates.py, whose well-formed rows are exactly these, then deals with the column).
 * ValueError for buffers inconsistent with offset/n.  The GIL is released while parsing.  Up to 19 digits
 * (below 10^19: no overflow possible) are checked and combined eight at a time (SWAR).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "string_offsets.h"
#include "text_numbers.h"

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
    for (Py_ssize_t r = 0; r < n; r++) {
        Py_ssize_t k = offset + r;
        uint64_t v = 0;
        if (validity && !((validity[k >> 3] >> (k & 7)) & 1)) {
            store(out, r, bytes, 0);
            continue;
        }
        if (!plain_integer(data + off[k], (Py_ssize_t)off[k + 1] - off[k], is_signed, bits, &v))
            return r;
        store(out, r, bytes, v);
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

/* -1 = every row well formed, else the first row that is not. */
static Py_ssize_t date_rows(const int32_t *off, const uint8_t *data, Py_ssize_t offset, Py_ssize_t n,
                            int with_time, int64_t *out) {
    for (Py_ssize_t r = 0; r < n; r++) {
        int32_t a = off[offset + r];
        if (!fixed_date(data + a, (Py_ssize_t)off[offset + r + 1] - a, with_time, &out[r]))
            return r;
    }
    return -1;
}

static PyObject *py_dates(PyObject *self, PyObject *args) {
    Py_buffer ob, db;
    Py_ssize_t offset, n;
    int with_time;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*nnp", &ob, &db, &offset, &n, &with_time))
        return NULL;
    PyObject *result = NULL, *values = NULL;
    if (check_string_buffers(&ob, &db, NULL, 0, offset, n) < 0)
        goto done;
    values = PyBytes_FromStringAndSize(NULL, n * 8);
    if (!values)
        goto done;
    Py_ssize_t bad;
    int64_t *out = (int64_t *)PyBytes_AS_STRING(values);
    Py_BEGIN_ALLOW_THREADS
    bad = date_rows((const int32_t *)ob.buf, (const uint8_t *)db.buf, offset, n, with_time, out);
    Py_END_ALLOW_THREADS
    result = bad >= 0 ? Py_NewRef(Py_None) : Py_NewRef(values);
done:
    Py_XDECREF(values);
    PyBuffer_Release(&ob);
    PyBuffer_Release(&db);
    return result;
}

static PyMethodDef module_methods[] = {
    {"parse", py_parse, METH_VARARGS,
     "parse(offsets, data, validity, offset, n, signed, bits) -> values | first row not a plain integer."},
    {"dates", py_dates, METH_VARARGS,
     "dates(offsets, data, offset, n, with_time) -> int64 days (or local seconds) | None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_textints", "Plain decimal integer texts parsed to 8- to 64-bit values.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__textints(void) {
    return PyModule_Create(&module_def);
}
