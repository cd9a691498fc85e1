/*
 * What the k-way merge (kmerge.c) and the gathering of rows in merged order (kgather.c) share: a run's
 * column of values or byte strings, and checks of the buffers Python hands over.
 */
#ifndef REPLICAD_KRUNS_H
#define REPLICAD_KRUNS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define GIL_THRESHOLD 16384
/* bytes gather_binary's data buffer needs beyond the values: short values are copied SLACK bytes at once */
#define SLACK 32

typedef struct {
    char kind;
    const uint8_t *data;     /* values, or string data */
    const uint8_t *offsets;  /* strings: n + 1 offsets */
    Py_ssize_t data_len;
} key_col;

static inline int64_t str_offset(const key_col *c, Py_ssize_t i) {
    if (c->kind == 's')
        return ((const int32_t *)c->offsets)[i];
    return ((const int64_t *)c->offsets)[i];
}

/* A contiguous buffer of an object, as bytes. */
static inline int get_buffer(PyObject *obj, Py_buffer *view) {
    return PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS);
}

/* Whether the n + 1 offsets of a string column are in order and inside its data. */
static inline int check_offsets(const key_col *c, Py_ssize_t n) {
    int64_t prev = str_offset(c, 0);
    if (prev < 0)
        return -1;
    for (Py_ssize_t i = 1; i <= n; i++) {
        int64_t o = str_offset(c, i);
        if (o < prev)
            return -1;
        prev = o;
    }
    return prev <= c->data_len ? 0 : -1;
}

PyObject *py_gather_fixed(PyObject *self, PyObject *args);
PyObject *py_gather_binary(PyObject *self, PyObject *args);

#endif
