/* Arrow binary columns built by the text splitters (jsonsplit.c, csvsplit.c): for each column an int32
 * offsets buffer, a data buffer with 16 bytes of slack (zeroed by the filler), and a validity bitmap when
 * some row has no value, each from the caller's alloc(nbytes) (pa.allocate_buffer).  Included by each
 * extension (each is its own shared object). */
#ifndef REPLICAD_COLUMN_BUFFERS_H
#define REPLICAD_COLUMN_BUFFERS_H

#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    Py_ssize_t width, rows;
    PyObject **objs;  /* 3 per column: offsets, data, validity (NULL: none) */
    Py_buffer *views;
    int32_t **offsets;
    uint8_t **data, **valid;
} column_buffers;

/* Allocates the buffers of `width` columns of `rows` rows: column c has sizes[c] value bytes and
 * valued[c] rows with a value; none for a column c with skip[c] set (skip NULL: none skipped).  0, or -1
 * with a Python error set (column_buffers_free still to call). */
static int column_buffers_alloc(column_buffers *cb, PyObject *alloc, Py_ssize_t width, Py_ssize_t rows,
                                const Py_ssize_t *sizes, const Py_ssize_t *valued, const char *skip) {
    memset(cb, 0, sizeof *cb);
    cb->width = width;
    cb->rows = rows;
    cb->objs = calloc((size_t)width * 3, sizeof(PyObject *));
    cb->views = calloc((size_t)width * 3, sizeof(Py_buffer));
    cb->offsets = calloc((size_t)width, sizeof(int32_t *));
    cb->data = calloc((size_t)width, sizeof(uint8_t *));
    cb->valid = calloc((size_t)width, sizeof(uint8_t *));
    if (!cb->objs || !cb->views || !cb->offsets || !cb->data || !cb->valid) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t bitmap = (rows + 7) / 8;
    for (Py_ssize_t i = 0; i < 3 * width; i++) {
        Py_ssize_t c = i / 3, part = i % 3;
        if (skip && skip[c])
            continue;
        if (part == 2 && valued[c] == rows)
            continue; /* no validity bitmap */
        Py_ssize_t size = part == 0 ? (rows + 1) * 4 : part == 1 ? sizes[c] + 16 : bitmap;
        PyObject *obj = PyObject_CallFunction(alloc, "n", size);
        if (!obj)
            return -1;
        if (PyObject_GetBuffer(obj, &cb->views[i], PyBUF_WRITABLE) < 0) {
            Py_DECREF(obj);
            return -1;
        }
        cb->objs[i] = obj;
        if (cb->views[i].len < size) {
            PyErr_SetString(PyExc_ValueError, "alloc returned a buffer too short");
            return -1;
        }
        if (part == 0) {
            cb->offsets[c] = (int32_t *)cb->views[i].buf;
            if (((uintptr_t)cb->offsets[c]) % 4) {
                PyErr_SetString(PyExc_ValueError, "alloc returned a buffer not 4-byte aligned");
                return -1;
            }
        } else if (part == 1) {
            cb->data[c] = (uint8_t *)cb->views[i].buf;
        } else {
            cb->valid[c] = (uint8_t *)cb->views[i].buf;
            memset(cb->valid[c], 0, (size_t)bitmap);
        }
    }
    return 0;
}

/* Column c as a new tuple (offsets, data, validity | None[, extra]) — extra NULL: a triple. */
static PyObject *column_buffers_tuple(const column_buffers *cb, Py_ssize_t c, PyObject *extra) {
    PyObject *v = cb->objs[3 * c + 2] ? cb->objs[3 * c + 2] : Py_None;
    if (extra)
        return PyTuple_Pack(4, cb->objs[3 * c], cb->objs[3 * c + 1], v, extra);
    return PyTuple_Pack(3, cb->objs[3 * c], cb->objs[3 * c + 1], v);
}

static void column_buffers_free(column_buffers *cb) {
    if (cb->objs) {
        for (Py_ssize_t i = 0; i < 3 * cb->width; i++) {
            if (cb->objs[i]) {
                PyBuffer_Release(&cb->views[i]);
                Py_DECREF(cb->objs[i]);
            }
        }
    }
    free(cb->objs);
    free(cb->views);
    free(cb->offsets);
    free(cb->data);
    free(cb->valid);
    memset(cb, 0, sizeof *cb);
}

#endif
