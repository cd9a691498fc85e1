/* The checks the text parsers (arraytext.c, textints.c) make on an Arrow string array's buffers before
 * reading rows [offset, offset + n) of them: every offset inside the data, in order, the buffers long
 * enough and the offsets aligned.  Included by each extension (each is its own shared object). */
#ifndef REPLICAD_STRING_OFFSETS_H
#define REPLICAD_STRING_OFFSETS_H

#include <Python.h>
#include <stdint.h>

/* 0 when the rows can be read; else -1 with ValueError set. */
static int check_string_buffers(const Py_buffer *ob, const Py_buffer *db, const Py_buffer *vb,
                                int has_validity, Py_ssize_t offset, Py_ssize_t n) {
    const int32_t *off = (const int32_t *)ob->buf;
    if (offset < 0 || n < 0 || (offset + n + 1) * 4 > ob->len ||
        (has_validity && (offset + n + 7) / 8 > vb->len)) {
        PyErr_SetString(PyExc_ValueError, "buffers too short for offset and length");
        return -1;
    }
    if (((uintptr_t)ob->buf) % 4) {
        PyErr_SetString(PyExc_ValueError, "offsets buffer is not 4-byte aligned");
        return -1;
    }
    for (Py_ssize_t k = offset; k < offset + n; k++) {
        if (off[k] < 0 || off[k + 1] < off[k] || off[k + 1] > db->len) {
            PyErr_Format(PyExc_ValueError, "offset %zd out of order or outside the %zd-byte data", k + 1,
                         db->len);
            return -1;
        }
    }
    return 0;
}

#endif
