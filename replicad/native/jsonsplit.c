/*
 * A block of JSONEachRow objects split into one Arrow `binary` column per named column: the text of each
 * value, strings unescaped, as the row-by-row reader hands values to the type converters.
 *
 * Python API (module replicad.native._jsonsplit):
 *   split(block, names, skip_unknown, alloc, kinds=None)
 *       -> list[tuple[offsets | None, data, validity | None]] | None
 *       `block` holds flat JSON objects separated by white space (one per line, as ClickHouse writes
 *       them).  For each name of `names` (a tuple of bytes) the result has a triple ready for
 *       pa.Array.from_buffers(pa.binary(), rows, [validity, offsets, data]): int32 offsets of rows + 1
 *       values, the value bytes (16 bytes of slack at the end), and a validity bitmap (bit set: a value)
 *       or None when every row has a value.  A value is: a string's unescaped bytes (raw bytes that are
 *       not UTF-8 pass through as ClickHouse writes them), a number's text as written, "1" / "0" for
 *       true / false; null and an omitted field are no value.  Buffers come from alloc(nbytes)
 *       (pa.allocate_buffer).
 *       Returns None, leaving the block to the general readers (which word the errors), for anything
 *       else: invalid JSON, an array or object value, a key given twice in an object, a key with an
 *       escape, a control character inside a string, a lone surrogate, a key not in `names` (unless
 *       skip_unknown: its scalar value is skipped), an empty block, or a block of 2 GiB or more.
 *       kinds (bytes, one per name; text_numbers.h): a column of a typed kind whose every row has a
 *       number or a string without escapes (not null, omitted, true or false) of that kind's shape and
 *       range comes back as (None, values, None), its values read straight from the block (rows * size
 *       bytes, little-endian, from alloc); any other column as above.
 * The GIL is released while scanning and copying.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <emmintrin.h> /* SSE2: part of x86-64 */

#include "column_buffers.h"
#include "text_numbers.h"

enum { K_NONE = 0, K_RAW = 1, K_ESC = 2, K_TRUE = 3, K_FALSE = 4 };

typedef struct {
    const uint8_t *const *names;
    const Py_ssize_t *name_lens;
    Py_ssize_t width;
    int skip_unknown;
    /* per field, row-major: start, end in the block, kind */
    int32_t *spans;
    uint8_t *kinds;
    Py_ssize_t rows, cap;
    Py_ssize_t *sizes;   /* bytes per column */
    Py_ssize_t *valued;  /* rows with a value per column */
} scan_state;

static inline int is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static inline Py_ssize_t skip_ws(const uint8_t *s, Py_ssize_t i, Py_ssize_t len) {
    while (i < len && is_ws(s[i]))
        i++;
    return i;
}

static int hex4(const uint8_t *s, Py_ssize_t i, Py_ssize_t len, uint32_t *out) {
    if (i + 4 > len)
        return -1;
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        uint8_t c = s[i + k];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (uint32_t)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

/* A string starting after its opening quote at i: sets *end to the closing quote, *out_len to the
 * unescaped length, *escaped when it holds an escape.  0 ok, 1 declined. */
static int scan_string(const uint8_t *s, Py_ssize_t i, Py_ssize_t len, Py_ssize_t *end, Py_ssize_t *out_len,
                       int *escaped) {
    Py_ssize_t n = 0;
    *escaped = 0;
    while (i < len) {
        uint8_t c = s[i];
        if (c == '"') {
            *end = i;
            *out_len = n;
            return 0;
        }
        if (c < 0x20)
            return 1;
        if (c != '\\') {
            n++;
            i++;
            continue;
        }
        *escaped = 1;
        if (i + 1 >= len)
            return 1;
        uint8_t e = s[i + 1];
        if (e == 'u') {
            uint32_t cp, lo;
            if (hex4(s, i + 2, len, &cp) < 0)
                return 1;
            i += 6;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (i + 1 >= len || s[i] != '\\' || s[i + 1] != 'u' || hex4(s, i + 2, len, &lo) < 0 ||
                    lo < 0xDC00 || lo > 0xDFFF)
                    return 1;
                i += 6;
                n += 4;
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return 1;
            } else {
                n += cp < 0x80 ? 1 : cp < 0x800 ? 2 : 3;
            }
        } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' ||
                   e == 't') {
            n++;
            i += 2;
        } else {
            return 1;
        }
    }
    return 1;
}

static inline Py_ssize_t digits(const uint8_t *s, Py_ssize_t j, Py_ssize_t len) {
    while (j < len && s[j] >= '0' && s[j] <= '9')
        j++;
    return j;
}

/* A JSON number at i: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? ; *end one past it.  0 ok, 1 declined. */
static int scan_number(const uint8_t *s, Py_ssize_t i, Py_ssize_t len, Py_ssize_t *end) {
    Py_ssize_t j = i;
    if (j < len && s[j] == '-')
        j++;
    if (j >= len || s[j] < '0' || s[j] > '9')
        return 1;
    j = s[j] == '0' ? j + 1 : digits(s, j, len);
    if (j < len && s[j] == '.') {
        Py_ssize_t k = digits(s, j + 1, len);
        if (k == j + 1)
            return 1;
        j = k;
    }
    if (j < len && (s[j] == 'e' || s[j] == 'E')) {
        j++;
        if (j < len && (s[j] == '+' || s[j] == '-'))
            j++;
        Py_ssize_t k = digits(s, j, len);
        if (k == j)
            return 1;
        j = k;
    }
    *end = j;
    return 0;
}

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

static inline Py_ssize_t find_name(const scan_state *st, const uint8_t *key, Py_ssize_t klen, Py_ssize_t guess) {
    for (Py_ssize_t k = 0; k < st->width; k++) {
        Py_ssize_t c = guess + k;
        if (c >= st->width)
            c -= st->width;
        if (st->name_lens[c] == klen && (klen == 0 || (st->names[c][0] == key[0] &&
                                              memcmp(st->names[c], key, (size_t)klen) == 0)))
            return c;
    }
    return -1;
}

/* 0 ok, 1 declined, -1 out of memory. */
static int scan(const uint8_t *s, Py_ssize_t len, scan_state *st) {
    Py_ssize_t i = skip_ws(s, 0, len);
    while (i < len) {
        if (s[i] != '{')
            return 1;
        if (st->rows == st->cap && grow(st) < 0)
            return -1;
        int32_t *spans = st->spans + st->rows * st->width * 2;
        uint8_t *kinds = st->kinds + st->rows * st->width;
        memset(kinds, K_NONE, (size_t)st->width);
        for (Py_ssize_t c = 0; c < st->width; c++)
            spans[2 * c] = -1; /* not seen */
        i = skip_ws(s, i + 1, len);
        if (i >= len)
            return 1;
        Py_ssize_t guess = 0;
        if (s[i] != '}') {
            for (;;) {
                if (i >= len || s[i] != '"')
                    return 1;
                Py_ssize_t k0 = i + 1, k1 = k0;
                while (k1 < len && s[k1] != '"' && s[k1] != '\\' && s[k1] >= 0x20)
                    k1++;
                if (k1 >= len || s[k1] != '"')
                    return 1;
                Py_ssize_t c = find_name(st, s + k0, k1 - k0, guess);
                if (c < 0 && !st->skip_unknown)
                    return 1;
                i = skip_ws(s, k1 + 1, len);
                if (i >= len || s[i] != ':')
                    return 1;
                i = skip_ws(s, i + 1, len);
                if (i >= len)
                    return 1;
                if (c >= 0) {
                    if (spans[2 * c] != -1)
                        return 1; /* given twice */
                    guess = c + 1 < st->width ? c + 1 : 0;
                }
                uint8_t kind;
                Py_ssize_t v0, v1, vlen;
                uint8_t ch = s[i];
                if (ch == '"') {
                    int esc;
                    if (scan_string(s, i + 1, len, &v1, &vlen, &esc) != 0)
                        return 1;
                    v0 = i + 1;
                    kind = esc ? K_ESC : K_RAW;
                    i = v1 + 1;
                } else if (ch == 'n' && i + 4 <= len && memcmp(s + i, "null", 4) == 0) {
                    v0 = v1 = i;
                    vlen = 0;
                    kind = K_NONE;
                    i += 4;
                } else if (ch == 't' && i + 4 <= len && memcmp(s + i, "true", 4) == 0) {
                    v0 = v1 = i;
                    vlen = 1;
                    kind = K_TRUE;
                    i += 4;
                } else if (ch == 'f' && i + 5 <= len && memcmp(s + i, "false", 5) == 0) {
                    v0 = v1 = i;
                    vlen = 1;
                    kind = K_FALSE;
                    i += 5;
                } else if ((ch >= '0' && ch <= '9') || ch == '-') {
                    v0 = i;
                    if (scan_number(s, i, len, &v1) != 0)
                        return 1;
                    vlen = v1 - v0;
                    kind = K_RAW;
                    i = v1;
                } else {
                    return 1; /* arrays, objects, anything else */
                }
                if (c >= 0) {
                    spans[2 * c] = (int32_t)v0;
                    spans[2 * c + 1] = (int32_t)v1;
                    kinds[c] = kind;
                    if (kind != K_NONE) {
                        st->sizes[c] += vlen;
                        st->valued[c]++;
                    }
                }
                i = skip_ws(s, i, len);
                if (i >= len)
                    return 1;
                if (s[i] == ',') {
                    i = skip_ws(s, i + 1, len);
                    continue;
                }
                if (s[i] == '}')
                    break;
                return 1;
            }
        }
        st->rows++;
        i = skip_ws(s, i + 1, len);
    }
    return st->rows ? 0 : 1;
}

static inline uint8_t *put_utf8(uint8_t *o, uint32_t cp) {
    if (cp < 0x80) {
        *o++ = (uint8_t)cp;
    } else if (cp < 0x800) {
        *o++ = (uint8_t)(0xC0 | (cp >> 6));
        *o++ = (uint8_t)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        *o++ = (uint8_t)(0xE0 | (cp >> 12));
        *o++ = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        *o++ = (uint8_t)(0x80 | (cp & 0x3F));
    } else {
        *o++ = (uint8_t)(0xF0 | (cp >> 18));
        *o++ = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
        *o++ = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        *o++ = (uint8_t)(0x80 | (cp & 0x3F));
    }
    return o;
}

/* Unescapes s[i:end) (validated by scan_string) into o; returns the end of the output. */
static uint8_t *unescape(const uint8_t *s, Py_ssize_t i, Py_ssize_t end, uint8_t *o) {
    while (i < end) {
        uint8_t c = s[i++];
        if (c != '\\') {
            *o++ = c;
            continue;
        }
        uint8_t e = s[i++];
        switch (e) {
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            uint32_t cp = 0, lo = 0;
            hex4(s, i, end, &cp);
            i += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                hex4(s, i + 2, end, &lo);
                i += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            o = put_utf8(o, cp);
            break;
        }
        default: *o++ = e; break; /* " \ / */
        }
    }
    return o;
}

static void fill(const uint8_t *s, Py_ssize_t len, const scan_state *st, int32_t *const *offs,
                 uint8_t *const *datas, uint8_t *const *valid, const char *typed) {
    Py_ssize_t w = st->width;
    for (Py_ssize_t c = 0; c < w; c++) {
        if (typed[c])
            continue; /* read already, as its values */
        int32_t *off = offs[c];
        uint8_t *base = datas[c], *o = base;
        uint8_t *bits = valid[c];
        off[0] = 0;
        for (Py_ssize_t r = 0; r < st->rows; r++) {
            const int32_t *sp = st->spans + (r * w + c) * 2;
            uint8_t kind = st->kinds[r * w + c];
            switch (kind) {
            case K_RAW: {
                Py_ssize_t n = sp[1] - sp[0];
                if (n <= 16 && sp[0] + 16 <= len) /* one 16-byte move: the output has 16 bytes of slack */
                    _mm_storeu_si128((__m128i *)o, _mm_loadu_si128((const __m128i *)(s + sp[0])));
                else
                    memcpy(o, s + sp[0], (size_t)n);
                o += n;
                break;
            }
            case K_ESC:
                o = unescape(s, sp[0], sp[1], o);
                break;
            case K_TRUE: *o++ = '1'; break;
            case K_FALSE: *o++ = '0'; break;
            default: break;
            }
            if (bits && kind != K_NONE)
                bits[r >> 3] |= (uint8_t)(1u << (r & 7));
            off[r + 1] = (int32_t)(o - base);
        }
        memset(o, 0, 16); /* the slack holds no stray bytes (copied or left by the allocator) */
    }
}

static PyObject *py_split(PyObject *self, PyObject *args) {
    Py_buffer bb;
    PyObject *names_obj, *alloc, *kinds_obj = Py_None;
    int skip_unknown;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*O!pO|O", &bb, &PyTuple_Type, &names_obj, &skip_unknown, &alloc,
                          &kinds_obj))
        return NULL;
    const uint8_t *s = (const uint8_t *)bb.buf;
    Py_ssize_t width = PyTuple_GET_SIZE(names_obj);
    PyObject *result = NULL;
    scan_state st;
    memset(&st, 0, sizeof st);
    column_buffers cb;
    memset(&cb, 0, sizeof cb);
    const uint8_t **names = NULL;
    Py_ssize_t *name_lens = NULL;
    char *typed = NULL; /* per column: its kind when read as values, 0 when split as texts */
    PyObject **vals = NULL;
    Py_buffer *val_views = NULL;
    const char *kinds = NULL;
    if (kinds_obj != Py_None) {
        if (!PyBytes_Check(kinds_obj) || PyBytes_GET_SIZE(kinds_obj) != width) {
            PyErr_SetString(PyExc_ValueError, "kinds must be bytes, one per name");
            goto done;
        }
        kinds = PyBytes_AS_STRING(kinds_obj);
    }
    if (width < 1 || bb.len == 0 || bb.len >= INT32_MAX) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    names = calloc((size_t)width, sizeof(*names));
    name_lens = calloc((size_t)width, sizeof(Py_ssize_t));
    st.sizes = calloc((size_t)width, sizeof(Py_ssize_t));
    st.valued = calloc((size_t)width, sizeof(Py_ssize_t));
    typed = calloc((size_t)width, 1);
    vals = calloc((size_t)width, sizeof(PyObject *));
    val_views = calloc((size_t)width, sizeof(Py_buffer));
    if (!names || !name_lens || !st.sizes || !st.valued || !typed || !vals || !val_views) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t c = 0; c < width; c++) {
        PyObject *n = PyTuple_GET_ITEM(names_obj, c);
        if (!PyBytes_Check(n)) {
            PyErr_SetString(PyExc_TypeError, "names must be bytes");
            goto done;
        }
        names[c] = (const uint8_t *)PyBytes_AS_STRING(n);
        name_lens[c] = PyBytes_GET_SIZE(n);
    }
    st.names = names;
    st.name_lens = name_lens;
    st.width = width;
    st.skip_unknown = skip_unknown;
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
    if (typed_columns(s, alloc, width, st.rows, kinds, st.valued, st.spans, st.kinds, K_RAW, vals, val_views,
                      typed) < 0)
        goto done;
    if (column_buffers_alloc(&cb, alloc, width, st.rows, st.sizes, st.valued, typed) < 0)
        goto done;
    Py_BEGIN_ALLOW_THREADS
    fill(s, bb.len, &st, cb.offsets, cb.data, cb.valid, typed);
    Py_END_ALLOW_THREADS
    PyObject *list = PyList_New(width);
    if (!list)
        goto done;
    for (Py_ssize_t c = 0; c < width; c++) {
        PyObject *t = typed[c] ? PyTuple_Pack(3, Py_None, vals[c], Py_None)
                               : column_buffers_tuple(&cb, c, NULL);
        if (!t) {
            Py_DECREF(list);
            goto done;
        }
        PyList_SET_ITEM(list, c, t);
    }
    result = list;
done:
    column_buffers_free(&cb);
    free(st.spans);
    free(st.kinds);
    free(st.sizes);
    free(st.valued);
    free(names);
    free(name_lens);
    typed_columns_free(width, vals, val_views, typed);
    PyBuffer_Release(&bb);
    return result;
}

static PyMethodDef module_methods[] = {
    {"split", py_split, METH_VARARGS,
     "split(block, names, skip_unknown, alloc, kinds=None) -> [(offsets | None, data, validity | None)] per "
     "name, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_jsonsplit", "JSONEachRow objects split into Arrow binary columns.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jsonsplit(void) { return PyModule_Create(&module_def); }
