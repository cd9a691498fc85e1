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
        if (len - i <= 19) { /* below 10^19: cannot pass 64 bits, no overflow check per digit */
            while (len - i >= 8) { /* eight digits at a time (SWAR, as fast_float parses them) */
                uint64_t w;
                memcpy(&w, s + i, 8);
                if (((w + 0x4646464646464646ULL) | (w - 0x3030303030303030ULL)) & 0x8080808080808080ULL)
                    return r; /* a byte that is not a digit */
                w -= 0x3030303030303030ULL;
                w = w * 10 + (w >> 8);
                w = (((w & 0x000000FF000000FFULL) * 0x000F424000000064ULL) +
                     (((w >> 16) & 0x000000FF000000FFULL) * 0x0000271000000001ULL)) >> 32;
                v = v * 100000000ULL + (uint32_t)w;
                i += 8;
            }
            for (; i < len; i++) {
                unsigned d = (unsigned)s[i] - '0';
                if (d > 9)
                    return r;
                v = v * 10 + d;
            }
        }
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

/* Days since 1970-01-01 of a proleptic Gregorian date (the same formula as dates.py's numpy one). */
static inline int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static inline int month_length(int64_t y, int64_t m) {
    static const int len[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return len[m - 1] + (m == 2 && leap);
}

/* Two digits at p (0..99), or -1. */
static inline int two(const uint8_t *p) {
    unsigned a = (unsigned)p[0] - '0', b = (unsigned)p[1] - '0';
    return a <= 9 && b <= 9 ? (int)(a * 10 + b) : -1;
}

/* -1 = every row well formed, else the first row that is not. */
static Py_ssize_t date_rows(const int32_t *off, const uint8_t *data, Py_ssize_t offset, Py_ssize_t n,
                            int with_time, int64_t *out) {
    int32_t width = with_time ? 19 : 10;
    for (Py_ssize_t r = 0; r < n; r++) {
        int32_t a = off[offset + r];
        if (off[offset + r + 1] - a != width)
            return r;
        const uint8_t *p = data + a;
        int hi = two(p), lo = two(p + 2), m = two(p + 5), d = two(p + 8);
        if (hi < 0 || lo < 0 || m < 0 || d < 0 || p[4] != '-' || p[7] != '-')
            return r;
        int64_t y = hi * 100 + lo;
        if (y < 1900 || y >= 2300 || m < 1 || m > 12 || d < 1 || d > month_length(y, m))
            return r;
        int64_t v = days_from_civil(y, m, d);
        if (with_time) {
            int hh = two(p + 11), mm = two(p + 14), ss = two(p + 17);
            if ((p[10] != ' ' && p[10] != 'T') || p[13] != ':' || p[16] != ':' || hh < 0 || hh >= 24 ||
                mm < 0 || mm >= 60 || ss < 0 || ss >= 60)
                return r;
            v = v * 86400 + hh * 3600 + mm * 60 + ss;
        }
        out[r] = v;
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
