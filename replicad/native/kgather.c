/*
 * Gathering the rows of a merge round's runs in merged order (module replicad.native._kmerge: see
 * kmerge.c for the API): per merged row, row rows[i] of run sources[i], copied straight from the runs.
 */
#include "kruns.h"

/* Whether every (sources[i], rows[i]) names an existing row of an existing run. */
static int check_rows(const int32_t *sources, const int32_t *rows, Py_ssize_t n, Py_ssize_t k,
                      const Py_ssize_t *counts) {
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t s = sources[i];
        if (s < 0 || s >= k || rows[i] < 0 || rows[i] >= counts[s]) {
            PyErr_Format(PyExc_ValueError, "merged row %zd: no row %d in run %d", i, (int)rows[i], (int)s);
            return -1;
        }
    }
    return 0;
}

/* The int32 (sources, rows) buffers of a merged order, of equal lengths. */
static int get_order(PyObject *src_obj, PyObject *rows_obj, Py_buffer *sb, Py_buffer *rb) {
    if (get_buffer(src_obj, sb) < 0)
        return -1;
    if (get_buffer(rows_obj, rb) < 0) {
        PyBuffer_Release(sb);
        return -1;
    }
    if (sb->len % 4 || sb->len != rb->len) {
        PyErr_SetString(PyExc_ValueError, "sources and rows must be int32 buffers of equal lengths");
        PyBuffer_Release(sb);
        PyBuffer_Release(rb);
        return -1;
    }
    return 0;
}

/* Returns -1, or the first merged row naming a run or row that does not exist (nothing past it written). */
static Py_ssize_t gather_fixed(int width, Py_ssize_t k, const uint8_t **bufs, const Py_ssize_t *counts,
                               const int32_t *sources, const int32_t *rows, Py_ssize_t n, uint8_t *out) {
#define GATHER(T)                                                                                       \
    for (Py_ssize_t i = 0; i < n; i++) {                                                                \
        int32_t s = sources[i], r = rows[i];                                                            \
        if ((uint32_t)s >= (uint64_t)k || r < 0 || r >= counts[s])                                      \
            return i;                                                                                   \
        memcpy(out + i * sizeof(T), bufs[s] + (size_t)r * sizeof(T), sizeof(T));                        \
    }
    switch (width) {
    case 1: GATHER(uint8_t) break;
    case 2: GATHER(uint16_t) break;
    case 4: GATHER(uint32_t) break;
    case 8: GATHER(uint64_t) break;
    default:
        for (Py_ssize_t i = 0; i < n; i++) {
            int32_t s = sources[i], r = rows[i];
            if ((uint32_t)s >= (uint64_t)k || r < 0 || r >= counts[s])
                return i;
            memcpy(out + i * width, bufs[s] + (size_t)r * width, (size_t)width);
        }
    }
#undef GATHER
    return -1;
}

PyObject *py_gather_fixed(PyObject *self, PyObject *args) {
    int width;
    PyObject *runs_obj, *src_obj, *rows_obj, *out_obj = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "iO!OO|O", &width, &PyList_Type, &runs_obj, &src_obj, &rows_obj, &out_obj))
        return NULL;
    if (width <= 0) {
        PyErr_SetString(PyExc_ValueError, "width must be positive");
        return NULL;
    }
    Py_ssize_t k = PyList_GET_SIZE(runs_obj);
    Py_buffer sb, rb;
    if (get_order(src_obj, rows_obj, &sb, &rb) < 0)
        return NULL;
    Py_buffer *views = PyMem_Calloc((size_t)k + 1, sizeof(Py_buffer));
    const uint8_t **bufs = PyMem_Calloc((size_t)k + 1, sizeof(uint8_t *));
    Py_ssize_t *counts = PyMem_Calloc((size_t)k + 1, sizeof(Py_ssize_t));
    Py_ssize_t got = 0;
    PyObject *result = NULL;
    Py_buffer ob = {0};
    int have_out = 0;
    if (!views || !bufs || !counts) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t r = 0; r < k; r++) {
        if (get_buffer(PyList_GET_ITEM(runs_obj, r), &views[r]) < 0)
            goto done;
        got++;
        if (views[r].len % width) {
            PyErr_Format(PyExc_ValueError, "run %zd: %zd bytes is not a multiple of %d", r, views[r].len,
                         width);
            goto done;
        }
        bufs[r] = views[r].buf;
        counts[r] = views[r].len / width;
    }
    Py_ssize_t n = sb.len / 4;
    const int32_t *sources = sb.buf, *rows = rb.buf;
    uint8_t *out;
    if (out_obj != NULL && out_obj != Py_None) {
        if (PyObject_GetBuffer(out_obj, &ob, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        have_out = 1;
        if (ob.len < n * width) {
            PyErr_Format(PyExc_ValueError, "out holds %zd bytes, %zd needed", ob.len, n * width);
            goto done;
        }
        result = PyLong_FromSsize_t(n * width);
        if (!result)
            goto done;
        out = ob.buf;
    } else {
        result = PyBytes_FromStringAndSize(NULL, n * width);
        if (!result)
            goto done;
        out = (uint8_t *)PyBytes_AS_STRING(result);
    }
    Py_ssize_t bad;
    if (n >= GIL_THRESHOLD) {
        Py_BEGIN_ALLOW_THREADS
        bad = gather_fixed(width, k, bufs, counts, sources, rows, n, out);
        Py_END_ALLOW_THREADS
    } else {
        bad = gather_fixed(width, k, bufs, counts, sources, rows, n, out);
    }
    if (bad >= 0) {
        check_rows(sources, rows, n, k, counts); /* sets the error */
        Py_CLEAR(result);
    }
done:
    if (have_out)
        PyBuffer_Release(&ob);
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    PyBuffer_Release(&sb);
    PyBuffer_Release(&rb);
    PyMem_Free(views);
    PyMem_Free(bufs);
    PyMem_Free(counts);
    return result;
}

/* out_data has room for ``capacity`` bytes of values and SLACK bytes more: a short value is copied as
 * SLACK bytes at once (when as many are readable at its start), the next value overwriting the excess.
 * Returns the bytes written, -1 - i when merged row i names a run or row that does not exist, or
 * -1 - n when the values need more than ``capacity`` bytes (nothing is written past it). */

static int64_t gather_binary(int w, Py_ssize_t k, const key_col *cols, const Py_ssize_t *counts,
                             const int32_t *sources, const int32_t *rows, Py_ssize_t n, uint8_t *out_off,
                             uint8_t *out_data, int64_t capacity) {
    int64_t pos = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t s = sources[i], r = rows[i];
        if ((uint32_t)s >= (uint64_t)k || r < 0 || r >= counts[s])
            return -1 - i;
        const key_col *c = &cols[s];
        int64_t a = str_offset(c, r), b = str_offset(c, r + 1);
        if (b - a > capacity - pos)
            return -1 - n;
        if (w == 4)
            ((int32_t *)out_off)[i] = (int32_t)pos;
        else
            ((int64_t *)out_off)[i] = pos;
        if (b - a <= SLACK && a + SLACK <= c->data_len)
            memcpy(out_data + pos, c->data + a, SLACK);
        else
            memcpy(out_data + pos, c->data + a, (size_t)(b - a));
        pos += b - a;
    }
    if (w == 4)
        ((int32_t *)out_off)[n] = (int32_t)pos;
    else
        ((int64_t *)out_off)[n] = pos;
    return pos;
}

PyObject *py_gather_binary(PyObject *self, PyObject *args) {
    PyObject *runs_obj, *src_obj, *rows_obj;
    (void)self;
    PyObject *out_off_obj = NULL, *out_data_obj = NULL;
    if (!PyArg_ParseTuple(args, "O!OO|OO", &PyList_Type, &runs_obj, &src_obj, &rows_obj, &out_off_obj,
                          &out_data_obj))
        return NULL;
    Py_buffer oob = {0}, odb = {0};
    int have_out = 0;
    Py_ssize_t k = PyList_GET_SIZE(runs_obj);
    Py_buffer sb, rb;
    if (get_order(src_obj, rows_obj, &sb, &rb) < 0)
        return NULL;
    Py_buffer *views = PyMem_Calloc((size_t)(2 * k) + 1, sizeof(Py_buffer));
    key_col *cols = PyMem_Calloc((size_t)k + 1, sizeof(key_col));
    Py_ssize_t *counts = PyMem_Calloc((size_t)k + 1, sizeof(Py_ssize_t));
    Py_ssize_t got = 0;
    PyObject *result = NULL, *off_obj = NULL, *data_obj = NULL;
    int w = 0;
    if (!views || !cols || !counts) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t r = 0; r < k; r++) {
        PyObject *t = PyList_GET_ITEM(runs_obj, r);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2) {
            PyErr_Format(PyExc_ValueError, "run %zd: expected (offsets, data)", r);
            goto done;
        }
        Py_buffer *ov = &views[got];
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(t, 0), ov, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            goto done;
        got++;
        if (get_buffer(PyTuple_GET_ITEM(t, 1), &views[got]) < 0)
            goto done;
        Py_buffer *dv = &views[got];
        got++;
        int rw = (int)ov->itemsize;
        if ((rw != 4 && rw != 8) || (w && rw != w) || ov->len < rw) {
            PyErr_Format(PyExc_ValueError, "run %zd: offsets must be int32 or int64, alike in every run", r);
            goto done;
        }
        w = rw;
        cols[r].kind = w == 4 ? 's' : 'S';
        cols[r].offsets = ov->buf;
        cols[r].data = dv->buf;
        cols[r].data_len = dv->len;
        counts[r] = ov->len / w - 1;
        if (check_offsets(&cols[r], counts[r]) < 0) {
            PyErr_Format(PyExc_ValueError, "run %zd: offsets out of order or outside the data", r);
            goto done;
        }
    }
    Py_ssize_t n = sb.len / 4;
    const int32_t *sources = sb.buf, *rows = rb.buf;
    if (w == 0)
        w = 4;
    /* room for every row of every run (a merge round takes them all, each once) */
    int64_t total = 0;
    for (Py_ssize_t r = 0; r < k; r++)
        total += str_offset(&cols[r], counts[r]) - str_offset(&cols[r], 0);
    if (w == 4 && total > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "gathered data too large for int32 offsets");
        goto done;
    }
    uint8_t *oo, *od;
    if (out_off_obj != NULL && out_data_obj != NULL) {
        if (PyObject_GetBuffer(out_off_obj, &oob, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        if (PyObject_GetBuffer(out_data_obj, &odb, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
            PyBuffer_Release(&oob);
            goto done;
        }
        have_out = 1;
        if (oob.len < (n + 1) * w || odb.len < (Py_ssize_t)total + SLACK) {
            PyErr_Format(PyExc_ValueError, "out buffers hold %zd and %zd bytes, %zd and %zd needed", oob.len,
                         odb.len, (n + 1) * w, (Py_ssize_t)total + SLACK);
            goto done;
        }
        oo = oob.buf;
        od = odb.buf;
    } else {
        off_obj = PyBytes_FromStringAndSize(NULL, (n + 1) * w);
        data_obj = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total + SLACK);
        if (!off_obj || !data_obj)
            goto done;
        oo = (uint8_t *)PyBytes_AS_STRING(off_obj);
        od = (uint8_t *)PyBytes_AS_STRING(data_obj);
    }
    int64_t written;
    if (n >= GIL_THRESHOLD) {
        Py_BEGIN_ALLOW_THREADS
        written = gather_binary(w, k, cols, counts, sources, rows, n, oo, od, total);
        Py_END_ALLOW_THREADS
    } else {
        written = gather_binary(w, k, cols, counts, sources, rows, n, oo, od, total);
    }
    if (written == -1 - n) {
        PyErr_SetString(PyExc_ValueError, "merged rows name some run's rows more than once");
        goto done;
    }
    if (written < 0) {
        check_rows(sources, rows, n, k, counts); /* sets the error */
        goto done;
    }
    result = have_out ? PyLong_FromLongLong(written) : PyTuple_Pack(2, off_obj, data_obj);
done:
    if (have_out) {
        PyBuffer_Release(&oob);
        PyBuffer_Release(&odb);
    }
    Py_XDECREF(off_obj);
    Py_XDECREF(data_obj);
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    PyBuffer_Release(&sb);
    PyBuffer_Release(&rb);
    PyMem_Free(views);
    PyMem_Free(cols);
    PyMem_Free(counts);
    return result;
}

