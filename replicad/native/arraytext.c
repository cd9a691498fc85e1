/*
 * One-level array literals as ClickHouse writes them inside TabSeparated / CSV fields ("[1,2,NULL]",
 * "['a','it\'s']", "[ ]") split into the texts of their elements, in one pass over an Arrow binary column.
 *
 * Python API (module replicad.native._arraytext):
 *   split_flat(offsets, data, validity, offset, n) -> (list_offsets, elem_offsets, elem_data,
 *                                                      elem_validity, n_elements) | int
 *       offsets, data, validity: the buffers of an Arrow `binary` array (int32 offsets; validity may be
 *       None) and offset/n its slice.  Null rows become empty lists (the caller keeps them null).
 *       On success: list_offsets holds n + 1 int32 offsets into the elements; elem_offsets (int32,
 *       n_elements + 1) and elem_data are an Arrow `binary` array of the element texts (quotes removed,
 *       escapes resolved); elem_validity is its validity bitmap (bit clear = the unquoted word NULL), or
 *       None when no element is NULL.  Ready for pa.Array.from_buffers.
 *       When a row is not a one-level literal this parser accepts (malformed, or nested brackets), the
 *       index of the first such row (relative to offset) is returned instead: the caller's reference
 *       parser decides what it is and words the error.
 * The grammar matches replicad.server.text_values._literal: whitespace is " \t\r\n"; an element is a
 * quoted string (' or ", backslash escapes \t \n \r \0 \b \f \a \v \e, \xHH with two hex digits, any other
 * escaped character standing for itself, a doubled quote standing for one) or an unquoted word running
 * to the next ',', ']', '[' or whitespace.  ValueError for buffers inconsistent with offset/n.  The GIL
 * is released while parsing.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "string_offsets.h"

typedef struct {
    int32_t *offsets; /* element offsets, count + 1 used */
    uint8_t *valid;   /* validity bitmap, allocated at the first NULL element */
    Py_ssize_t count, cap;
    int any_null;
    uint8_t *data; /* element bytes (at most the input's size) */
    Py_ssize_t size;
    int oom;
} elems;

static inline int is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

static inline int hexval(uint8_t c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static inline uint8_t letter_escape(uint8_t c) {
    switch (c) {
    case 't': return '\t';
    case 'n': return '\n';
    case 'r': return '\r';
    case '0': return '\0';
    case 'b': return '\b';
    case 'f': return '\f';
    case 'a': return '\a';
    case 'v': return '\v';
    case 'e': return 0x1b;
    default: return c;
    }
}

/* Closes the current element (its bytes end at e->size); is_null marks it NULL. 0, or -1 out of memory. */
static int push(elems *e, int is_null) {
    if (e->count + 2 > e->cap) {
        Py_ssize_t cap = e->cap * 2;
        int32_t *o = realloc(e->offsets, (size_t)cap * sizeof(int32_t));
        if (!o)
            return -1;
        e->offsets = o;
        if (e->valid) {
            uint8_t *v = realloc(e->valid, (size_t)(cap / 8 + 1));
            if (!v)
                return -1;
            e->valid = v;
        }
        e->cap = cap;
    }
    Py_ssize_t i = e->count;
    if (is_null && !e->valid) {
        e->valid = malloc((size_t)(e->cap / 8 + 1));
        if (!e->valid)
            return -1;
        memset(e->valid, 0xff, (size_t)(e->cap / 8 + 1));
    }
    if (e->valid) {
        if (is_null)
            e->valid[i >> 3] &= (uint8_t) ~(1u << (i & 7));
        else
            e->valid[i >> 3] |= (uint8_t)(1u << (i & 7));
    }
    e->any_null |= is_null;
    e->count = i + 1;
    e->offsets[i + 1] = (int32_t)e->size;
    return 0;
}

/* Parses one row s[0:len) into e.  0 = ok, 1 = not accepted (the caller's parser decides), -1 = no memory. */
static int parse_row(const uint8_t *s, Py_ssize_t len, elems *e) {
    Py_ssize_t p = 0;
    while (p < len && is_ws(s[p]))
        p++;
    if (p >= len || s[p] != '[')
        return 1;
    p++;
    while (p < len && is_ws(s[p]))
        p++;
    if (p < len && s[p] == ']') {
        p++;
        goto tail;
    }
    for (;;) {
        if (p >= len)
            return 1;
        uint8_t c = s[p];
        if (c == '[')
            return 1; /* nested: the general parser's business */
        if (c == '\'' || c == '"') {
            uint8_t q = c;
            p++;
            for (;;) {
                if (p >= len)
                    return 1; /* unterminated */
                uint8_t ch = s[p];
                if (ch == '\\' && p + 1 < len) {
                    uint8_t nxt = s[p + 1];
                    if (nxt == 'x' && p + 3 < len) {
                        int hi = hexval(s[p + 2]), lo = hexval(s[p + 3]);
                        if (hi >= 0 && lo >= 0) {
                            e->data[e->size++] = (uint8_t)(hi * 16 + lo);
                            p += 4;
                            continue;
                        }
                    }
                    e->data[e->size++] = letter_escape(nxt);
                    p += 2;
                } else if (ch == q) {
                    if (p + 1 < len && s[p + 1] == q) {
                        e->data[e->size++] = q;
                        p += 2;
                        continue;
                    }
                    p++;
                    break;
                } else {
                    e->data[e->size++] = ch;
                    p++;
                }
            }
            if (push(e, 0) < 0)
                return -1;
        } else {
            Py_ssize_t w = p;
            while (p < len && s[p] != ',' && s[p] != ']' && s[p] != '[' && !is_ws(s[p]))
                p++;
            if (p == w)
                return 1; /* no value */
            int is_null = p - w == 4 && memcmp(s + w, "NULL", 4) == 0;
            if (!is_null) {
                memcpy(e->data + e->size, s + w, (size_t)(p - w));
                e->size += p - w;
            }
            if (push(e, is_null) < 0)
                return -1;
        }
        while (p < len && is_ws(s[p]))
            p++;
        if (p >= len)
            return 1;
        if (s[p] == ']') {
            p++;
            break;
        }
        if (s[p] != ',')
            return 1;
        p++;
        while (p < len && is_ws(s[p]))
            p++;
    }
tail:
    while (p < len && is_ws(s[p]))
        p++;
    return p == len ? 0 : 1;
}

/* Parses rows [0, n); returns -2 on success, -1 out of memory, else the first row not accepted. */
static Py_ssize_t parse_rows(const int32_t *off, const uint8_t *data, const uint8_t *validity,
                             Py_ssize_t offset, Py_ssize_t n, elems *e, int32_t *list_offsets) {
    list_offsets[0] = 0;
    for (Py_ssize_t r = 0; r < n; r++) {
        Py_ssize_t k = offset + r;
        int valid = !validity || (validity[k >> 3] >> (k & 7)) & 1;
        if (valid) {
            Py_ssize_t before = e->count, before_size = e->size;
            int rc = parse_row(data + off[k], (Py_ssize_t)off[k + 1] - off[k], e);
            if (rc < 0)
                return -1;
            if (rc > 0) {
                e->count = before;
                e->size = before_size;
                return r;
            }
        }
        list_offsets[r + 1] = (int32_t)e->count;
    }
    return -2;
}

static PyObject *py_split_flat(PyObject *self, PyObject *args) {
    Py_buffer ob, db, vb;
    PyObject *vobj;
    Py_ssize_t offset, n;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*Onn", &ob, &db, &vobj, &offset, &n))
        return NULL;
    int has_validity = vobj != Py_None;
    if (has_validity && PyObject_GetBuffer(vobj, &vb, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&ob);
        PyBuffer_Release(&db);
        return NULL;
    }
    PyObject *result = NULL, *lo = NULL, *eo = NULL, *ed = NULL, *ev = NULL;
    elems e;
    memset(&e, 0, sizeof e);
    const int32_t *off = (const int32_t *)ob.buf;
    if (check_string_buffers(&ob, &db, &vb, has_validity, offset, n) < 0)
        goto done;
    Py_ssize_t span = n ? (Py_ssize_t)off[offset + n] - off[offset] : 0;
    lo = PyBytes_FromStringAndSize(NULL, (n + 1) * 4);
    if (!lo)
        goto done;
    e.cap = n + 16;
    e.offsets = malloc((size_t)e.cap * sizeof(int32_t));
    e.data = malloc((size_t)span + 1);
    if (!e.offsets || !e.data) {
        PyErr_NoMemory();
        goto done;
    }
    e.offsets[0] = 0;
    Py_ssize_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = parse_rows(off, (const uint8_t *)db.buf, has_validity ? (const uint8_t *)vb.buf : NULL, offset, n,
                    &e, (int32_t *)PyBytes_AS_STRING(lo));
    Py_END_ALLOW_THREADS
    if (rc == -1) {
        PyErr_NoMemory();
        goto done;
    }
    if (rc >= 0) {
        result = PyLong_FromSsize_t(rc);
        goto done;
    }
    eo = PyBytes_FromStringAndSize((const char *)e.offsets, (e.count + 1) * 4);
    ed = PyBytes_FromStringAndSize((const char *)e.data, e.size);
    if (!eo || !ed)
        goto done;
    if (e.any_null) {
        ev = PyBytes_FromStringAndSize((const char *)e.valid, (e.count + 7) / 8);
        if (!ev)
            goto done;
    } else {
        ev = Py_NewRef(Py_None);
    }
    result = Py_BuildValue("(OOOOn)", lo, eo, ed, ev, e.count);
done:
    Py_XDECREF(lo);
    Py_XDECREF(eo);
    Py_XDECREF(ed);
    Py_XDECREF(ev);
    free(e.offsets);
    free(e.valid);
    free(e.data);
    PyBuffer_Release(&ob);
    PyBuffer_Release(&db);
    if (has_validity)
        PyBuffer_Release(&vb);
    return result;
}

static PyMethodDef module_methods[] = {
    {"split_flat", py_split_flat, METH_VARARGS,
     "split_flat(offsets, data, validity, offset, n) -> (list_offsets, elem_offsets, elem_data, "
     "elem_validity, n_elements) | first row not accepted."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_arraytext", "One-level ClickHouse array literals split into element texts.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__arraytext(void) {
    return PyModule_Create(&module_def);
}
