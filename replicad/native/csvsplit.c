/*
 * A block of CSV rows split into one Arrow `binary` column per field position, with the reading the insert
 * path asked of pyarrow's CSV reader before: fields separated by `delim`, a field that starts with `"` is
 * quoted (`""` inside stands for one quote; delimiters and line ends inside are data), an unquoted `\N` is
 * no value (NULL), a quoted one the two characters; rows end at "\n", "\r\n" or a lone "\r"; empty lines
 * are skipped.
 *
 * Python API (module replicad.native._csvsplit):
 *   split(block, width, delim, alloc, kinds=None)
 *       -> (list[tuple[offsets | None, data, validity | None, has_empty]], used) | None
 *       `used`: the bytes of the block that made the rows; the rest is a row cut by the block's end
 *       inside a quoted field (its line end was data): the caller puts it before the next block.
 *       Each column's buffers are ready for pa.Array.from_buffers(pa.binary(), rows, [validity, offsets,
 *       data]) (alloc(nbytes) = pa.allocate_buffer; 16 zeroed bytes of slack after the data);
 *       has_empty: some row's value is empty.
 *       None leaves the block to the general reader (which words the errors): a row with another number
 *       of fields, a quote inside an unquoted field or text after a closing quote, an empty block, a
 *       block of 2 GiB or more.
 *       kinds (bytes, one per field position; text_numbers.h): a column of a typed kind whose every field
 *       is unquoted or quoted without "" pairs, not \N, and has that kind's shape and range comes back as
 *       (None, values, None, False), its values read straight from the block (rows * size bytes,
 *       little-endian, from alloc); any other column as above.
 * The GIL is released while scanning and copying.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "column_buffers.h"
#include "text_numbers.h"

enum { K_RAW = 0, K_QUOTED = 1, K_NULL = 2 }; /* K_QUOTED: holds "" pairs to collapse */

typedef struct {
    Py_ssize_t width;
    uint8_t delim;
    int32_t *spans; /* per field, row-major: start, end */
    uint8_t *kinds;
    Py_ssize_t rows, cap, used;
    Py_ssize_t *sizes, *valued;
    uint8_t *empty;
    Py_ssize_t *row_n; /* the value bytes of the current row's fields, -1: NULL (counted once it is whole) */
} scan_state;

static int grow(scan_state *st) {
    Py_ssize_t cap = st->cap ? st->cap * 2 : 1024;
    int32_t *spans = realloc(st->spans, (size_t)cap * (size_t)st->width * 2 * sizeof(int32_t));
    if (!spans)
        return -1;
    st->spans = spans;
    uint8_t *kinds = realloc(st->kinds, (size_t)cap * (size_t)st->width);
    if (!kinds)
        return -1;
    st->kinds = kinds;
    st->cap = cap;
    return 0;
}

static inline int is_eol(uint8_t c) { return c == '\n' || c == '\r'; }

/* 0 ok (st->used set), 1 declined, -1 out of memory. */
static int scan(const uint8_t *s, Py_ssize_t len, scan_state *st) {
    Py_ssize_t i = 0, w = st->width;
    const uint8_t d = st->delim;
    while (i < len) {
        if (is_eol(s[i])) { /* an empty line */
            i++;
            continue;
        }
        Py_ssize_t row_start = i;
        if (st->rows == st->cap && grow(st) < 0)
            return -1;
        int32_t *spans = st->spans + st->rows * w * 2;
        uint8_t *kinds = st->kinds + st->rows * w;
        for (Py_ssize_t c = 0; c < w; c++) {
            Py_ssize_t v0, v1, n;
            uint8_t kind;
            if (i < len && s[i] == '"') {
                Py_ssize_t j = i + 1;
                int doubled = 0;
                n = 0;
                for (;;) {
                    const uint8_t *q = memchr(s + j, '"', (size_t)(len - j));
                    if (!q) { /* the block ends inside the quotes: the row continues in the next block */
                        st->used = row_start;
                        return 0;
                    }
                    Py_ssize_t k = q - s;
                    n += k - j;
                    if (k + 1 < len && s[k + 1] == '"') {
                        doubled = 1;
                        n++;
                        j = k + 2;
                        continue;
                    }
                    if (k + 1 == len) { /* a closing quote or the first of a pair cut by the block's end */
                        st->used = row_start;
                        return 0;
                    }
                    v0 = i + 1;
                    v1 = k;
                    i = k + 1;
                    break;
                }
                kind = doubled ? K_QUOTED : K_RAW;
                if (i < len && s[i] != d && !is_eol(s[i]))
                    return 1; /* text after the closing quote */
            } else {
                Py_ssize_t j = i;
                while (j < len && s[j] != d && !is_eol(s[j])) {
                    if (s[j] == '"')
                        return 1;
                    j++;
                }
                v0 = i;
                v1 = j;
                n = j - i;
                kind = n == 2 && s[i] == '\\' && s[i + 1] == 'N' ? K_NULL : K_RAW;
                i = j;
            }
            spans[2 * c] = (int32_t)v0;
            spans[2 * c + 1] = (int32_t)v1;
            kinds[c] = kind;
            st->row_n[c] = kind == K_NULL ? -1 : n;
            if (c + 1 < w) {
                if (i >= len || s[i] != d)
                    return 1; /* too few fields */
                i++;
            } else if (i < len && s[i] == d) {
                return 1; /* too many fields */
            }
        }
        if (i < len) { /* the line end */
            if (s[i] == '\r' && i + 1 < len && s[i + 1] == '\n')
                i++;
            i++;
        }
        for (Py_ssize_t c = 0; c < w; c++) {
            Py_ssize_t n = st->row_n[c];
            if (n >= 0) {
                st->sizes[c] += n;
                st->valued[c]++;
                st->empty[c] |= n == 0;
            }
        }
        st->rows++;
    }
    st->used = len;
    return 0;
}

static void fill(const uint8_t *s, Py_ssize_t len, const scan_state *st, const column_buffers *cb,
                 const char *typed) {
    Py_ssize_t w = st->width;
    for (Py_ssize_t c = 0; c < w; c++) {
        if (typed[c])
            continue; /* read already, as its values */
        int32_t *off = cb->offsets[c];
        uint8_t *base = cb->data[c], *o = base, *bits = cb->valid[c];
        off[0] = 0;
        for (Py_ssize_t r = 0; r < st->rows; r++) {
            const int32_t *sp = st->spans + (r * w + c) * 2;
            uint8_t kind = st->kinds[r * w + c];
            if (kind == K_RAW) {
                int32_t n = sp[1] - sp[0];
                if (n <= 16 && sp[0] + 16 <= len) /* a short field: one 16-byte copy (16 bytes of slack) */
                    memcpy(o, s + sp[0], 16);
                else
                    memcpy(o, s + sp[0], (size_t)n);
                o += n;
            } else if (kind == K_QUOTED) {
                for (Py_ssize_t j = sp[0]; j < sp[1]; j++) {
                    *o++ = s[j];
                    if (s[j] == '"')
                        j++; /* the second quote of a pair */
                }
            }
            if (bits && kind != K_NULL)
                bits[r >> 3] |= (uint8_t)(1u << (r & 7));
            off[r + 1] = (int32_t)(o - base);
        }
        memset(o, 0, 16); /* the slack holds no stray bytes */
    }
}

static PyObject *py_split(PyObject *self, PyObject *args) {
    Py_buffer bb;
    Py_ssize_t width;
    char delim;
    PyObject *alloc, *kinds_obj = Py_None;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*ncO|O", &bb, &width, &delim, &alloc, &kinds_obj))
        return NULL;
    const uint8_t *s = (const uint8_t *)bb.buf;
    PyObject *result = NULL;
    scan_state st;
    memset(&st, 0, sizeof st);
    column_buffers cb;
    memset(&cb, 0, sizeof cb);
    char *typed = NULL; /* per column: its kind when read as values, 0 when split as texts */
    PyObject **vals = NULL;
    Py_buffer *val_views = NULL;
    const char *kinds = NULL;
    if (kinds_obj != Py_None) {
        if (!PyBytes_Check(kinds_obj) || PyBytes_GET_SIZE(kinds_obj) != width) {
            PyErr_SetString(PyExc_ValueError, "kinds must be bytes, one per field position");
            goto done;
        }
        kinds = PyBytes_AS_STRING(kinds_obj);
    }
    if (width < 1 || bb.len == 0 || bb.len >= INT32_MAX || delim == '"' || delim == '\n' || delim == '\r') {
        result = Py_NewRef(Py_None);
        goto done;
    }
    st.width = width;
    st.delim = (uint8_t)delim;
    st.sizes = calloc((size_t)width, sizeof(Py_ssize_t));
    st.valued = calloc((size_t)width, sizeof(Py_ssize_t));
    st.empty = calloc((size_t)width, 1);
    st.row_n = calloc((size_t)width, sizeof(Py_ssize_t));
    typed = calloc((size_t)width, 1);
    vals = calloc((size_t)width, sizeof(PyObject *));
    val_views = calloc((size_t)width, sizeof(Py_buffer));
    if (!st.sizes || !st.valued || !st.empty || !st.row_n || !typed || !vals || !val_views) {
        PyErr_NoMemory();
        goto done;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = scan(s, bb.len, &st);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        PyErr_NoMemory();
        goto done;
    }
    if (rc > 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (typed_columns(s, alloc, width, st.rows, kinds, NULL, st.spans, st.kinds, K_RAW, vals, val_views,
                      typed) < 0)
        goto done;
    if (column_buffers_alloc(&cb, alloc, width, st.rows, st.sizes, st.valued, typed) < 0)
        goto done;
    Py_BEGIN_ALLOW_THREADS
    fill(s, bb.len, &st, &cb, typed);
    Py_END_ALLOW_THREADS
    PyObject *list = PyList_New(width);
    if (!list)
        goto done;
    for (Py_ssize_t c = 0; c < width; c++) {
        PyObject *t = typed[c] ? PyTuple_Pack(4, Py_None, vals[c], Py_None, Py_False)
                               : column_buffers_tuple(&cb, c, st.empty[c] ? Py_True : Py_False);
        if (!t) {
            Py_DECREF(list);
            goto done;
        }
        PyList_SET_ITEM(list, c, t);
    }
    result = Py_BuildValue("(Nn)", list, st.used);
done:
    column_buffers_free(&cb);
    free(st.spans);
    free(st.kinds);
    free(st.sizes);
    free(st.valued);
    free(st.empty);
    free(st.row_n);
    typed_columns_free(width, vals, val_views, typed);
    PyBuffer_Release(&bb);
    return result;
}

static PyMethodDef module_methods[] = {
    {"split", py_split, METH_VARARGS,
     "split(block, width, delim, alloc, kinds=None) -> ([(offsets | None, data, validity | None, has_empty)], "
     "used) or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_csvsplit", "CSV rows split into Arrow binary columns.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__csvsplit(void) { return PyModule_Create(&module_def); }
