/*
 * A block of TabSeparated lines split into one Arrow `binary` column per field position, the raw field
 * bytes copied once (no unescaping: that stays with the caller).
 *
 * Python API (module replicad.native._tsvsplit):
 *   split(block, width, skip_empty, alloc, kinds=None)
 *       -> list[tuple[offsets | None, data, has_backslash, has_empty]] | None
 *       Lines end at "\n", "\r\n" or a lone "\r" (as pyarrow's CSV reader ends them); the text after the
 *       last line end, when not empty, is one more line.  An empty line is skipped when skip_empty, else
 *       it is a row of one empty field.  Every other line must hold exactly `width` tab-separated fields.
 *       Returns `width` tuples (int32 offsets of rows + 1 values, data, whether a backslash occurs in
 *       the column: only then has it anything to unescape, whether some field of the column is empty:
 *       only then has a non-text column defaults to fill in), the first two ready for
 *       pa.Array.from_buffers(pa.binary(), rows, [None, offsets, data]), both from alloc(nbytes), which
 *       returns a writable buffer (pa.allocate_buffer: Arrow's pool keeps its pages mapped, so the copy
 *       does not fault in fresh pages for every block; data has 16 bytes of slack at its end);
 *       or None when some line has
 *       another number of fields, the block is empty, or it is 2 GiB or more (the caller's general
 *       reader then deals with the block and words the error).
 *       kinds (bytes, one per field position; text_numbers.h): a column of a typed kind whose every field
 *       has that kind's shape and range comes back as (None, values, False, False), its values read
 *       straight from the block (rows * size bytes, little-endian, from alloc); any other column as above.
 * The GIL is released while splitting.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <emmintrin.h> /* SSE2: part of x86-64 */
#include <pthread.h>

#include "text_numbers.h"

/* Each thread keeps its field-bounds buffer between calls (freed when the thread ends): a fresh one per
 * block cost a page fault per 4 KiB of bounds, as much as the splitting itself. */
static pthread_key_t bounds_key;

typedef struct {
    int32_t *buf;
    Py_ssize_t cap; /* in fields */
} bounds_cache;

static void free_cache(void *p) {
    bounds_cache *c = p;
    free(c->buf);
    free(c);
}

typedef struct {
    int32_t *bounds; /* start, end of each field, row-major */
    Py_ssize_t count, cap; /* in fields */
    Py_ssize_t *sizes; /* bytes per column */
} fields;

/* Bit i set: s[base + i] is a tab, CR or LF (i < 64, base + i < len). */
static inline uint64_t special_mask(const uint8_t *s, Py_ssize_t base, Py_ssize_t len) {
    uint64_t m = 0;
    if (base + 64 <= len) {
        const __m128i t = _mm_set1_epi8('\t'), n = _mm_set1_epi8('\n'), r = _mm_set1_epi8('\r');
        for (int k = 0; k < 4; k++) {
            __m128i v = _mm_loadu_si128((const __m128i *)(s + base + 16 * k));
            __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, t), _mm_cmpeq_epi8(v, n)),
                                       _mm_cmpeq_epi8(v, r));
            m |= (uint64_t)(uint16_t)_mm_movemask_epi8(hit) << (16 * k);
        }
        return m;
    }
    for (Py_ssize_t i = 0; base + i < len; i++) {
        uint8_t c = s[base + i];
        if (c == '\t' || c == '\n' || c == '\r')
            m |= (uint64_t)1 << i;
    }
    return m;
}

static inline int reserve(fields *f, Py_ssize_t width) {
    if (f->count + width <= f->cap)
        return 0;
    if (!f->bounds) {
        bounds_cache *c = pthread_getspecific(bounds_key);
        if (c && c->buf) {
            f->bounds = c->buf;
            f->cap = c->cap;
            c->buf = NULL;
            if (f->count + width <= f->cap)
                return 0;
        }
    }
    Py_ssize_t cap = f->cap * 2 + width * 1024;
    int32_t *b = realloc(f->bounds, (size_t)cap * 2 * sizeof(int32_t));
    if (!b)
        return -1;
    f->bounds = b;
    f->cap = cap;
    return 0;
}

/* The line s[line, end) whose fields start at line_fs (all but the last already recorded: got of them)
 * ends: record its last field.  0 ok, 1 shape mismatch. */
static inline int end_line(fields *f, Py_ssize_t width, int skip_empty, Py_ssize_t line, Py_ssize_t fs,
                           Py_ssize_t end, Py_ssize_t got, Py_ssize_t *rows) {
    if (end == line && skip_empty)
        return 0;
    if (got + 1 != width)
        return 1;
    int32_t *out = f->bounds + (f->count + got) * 2;
    out[0] = (int32_t)fs;
    out[1] = (int32_t)end;
    f->sizes[got] += end - fs;
    f->count += width;
    (*rows)++;
    return 0;
}

/* 0 ok, 1 shape mismatch, -1 no memory.  *rows_out: rows found. */
static int scan(const uint8_t *s, Py_ssize_t len, Py_ssize_t width, int skip_empty, fields *f,
                Py_ssize_t *rows_out) {
    Py_ssize_t rows = 0, line = 0, fs = 0, got = 0, skip_to = 0;
    if (reserve(f, width) < 0)
        return -1;
    for (Py_ssize_t base = 0; base < len; base += 64) {
        uint64_t m = special_mask(s, base, len);
        while (m) {
            Py_ssize_t q = base + __builtin_ctzll(m);
            m &= m - 1;
            if (q < skip_to)
                continue; /* the LF of a CR LF */
            if (s[q] == '\t') {
                if (got + 1 >= width)
                    return 1; /* more fields than columns */
                int32_t *out = f->bounds + (f->count + got) * 2;
                out[0] = (int32_t)fs;
                out[1] = (int32_t)q;
                f->sizes[got] += q - fs;
                got++;
                fs = q + 1;
                continue;
            }
            if (end_line(f, width, skip_empty, line, fs, q, got, &rows))
                return 1;
            if (reserve(f, width) < 0)
                return -1;
            skip_to = (s[q] == '\r' && q + 1 < len && s[q + 1] == '\n') ? q + 2 : q + 1;
            line = fs = skip_to;
            got = 0;
        }
    }
    if (line < len && end_line(f, width, skip_empty, line, fs, len, got, &rows))
        return 1;
    *rows_out = rows;
    return 0;
}

/* Copies the fields row by row, each column to its own cursor. */
/* Gives the bounds buffer back to the thread's cache (keeping the larger one). */
static void release_bounds(fields *f) {
    if (!f->bounds)
        return;
    bounds_cache *c = pthread_getspecific(bounds_key);
    if (!c) {
        c = calloc(1, sizeof *c);
        if (c && pthread_setspecific(bounds_key, c) != 0) {
            free(c);
            c = NULL;
        }
    }
    if (c && (!c->buf || c->cap < f->cap)) {
        free(c->buf);
        c->buf = f->bounds;
        c->cap = f->cap;
    } else {
        free(f->bounds);
    }
    f->bounds = NULL;
}

/* What fill does with a column: copy its texts, leave it, or (any other value: a kind of text_numbers.h)
 * read its fields as values. */
enum { COPY = 0, SKIP = 1 };

/* Goes through the fields row by row: copies each COPY column's texts to its own cursor (every data buffer
 * has 16 bytes of slack: short fields are copied 16 bytes at a time when the block has 16 bytes left to
 * read), reads each typed column's fields into vals[c] as long as ok[c] (cleared at its first field not of
 * the kind). */
static void fill(const uint8_t *s, Py_ssize_t len, const fields *f, Py_ssize_t width, Py_ssize_t rows,
                 int32_t **offsets, uint8_t **data, int32_t *at, uint8_t *empty, const char *mode,
                 uint8_t **vals, uint8_t *ok) {
    const int32_t *b = f->bounds;
    for (Py_ssize_t c = 0; c < width; c++) {
        if (mode[c] != COPY)
            continue;
        offsets[c][0] = 0;
        at[c] = 0;
    }
    for (Py_ssize_t r = 0; r < rows; r++) {
        for (Py_ssize_t c = 0; c < width; c++, b += 2) {
            int32_t n = b[1] - b[0];
            const uint8_t *src = s + b[0];
            if (mode[c] != COPY) {
                if (mode[c] != SKIP && ok[c] && !typed_field(src, n, mode[c], vals[c], r))
                    ok[c] = 0;
                continue;
            }
            uint8_t *dst = data[c] + at[c];
            if (n <= 16 && b[0] + 16 <= len) {
                memcpy(dst, src, 16);
            } else {
                memcpy(dst, src, (size_t)n);
            }
            at[c] += n;
            offsets[c][r + 1] = at[c];
            empty[c] |= n == 0;
        }
    }
    for (Py_ssize_t c = 0; c < width; c++)
        if (mode[c] == COPY)
            memset(data[c] + at[c], 0, 16); /* the slack: no stray bytes (copied or left by the allocator) */
}

/* alloc(size) as a writable buffer of at least size bytes: *obj and *view set (0), or -1 with an error set
 * and *obj NULL. */
static int alloc_view(PyObject *alloc, Py_ssize_t size, PyObject **obj, Py_buffer *view) {
    PyObject *o = PyObject_CallFunction(alloc, "n", size);
    if (!o)
        return -1;
    if (PyObject_GetBuffer(o, view, PyBUF_WRITABLE) < 0) {
        Py_DECREF(o);
        return -1;
    }
    *obj = o;
    if (view->len < size || ((uintptr_t)view->buf) % 4) {
        PyErr_SetString(PyExc_ValueError, "alloc returned a buffer too short or not 4-byte aligned");
        return -1;
    }
    return 0;
}

/* The offsets and data buffers of the columns whose mode is COPY (objs/views: 2 per column). */
static int alloc_texts(PyObject *alloc, Py_ssize_t width, Py_ssize_t rows, const Py_ssize_t *sizes,
                       const char *mode, PyObject **objs, Py_buffer *views, int32_t **offs, uint8_t **datas) {
    for (Py_ssize_t c = 0; c < width; c++) {
        if (mode[c] != COPY || objs[2 * c])
            continue;
        if (alloc_view(alloc, (rows + 1) * 4, &objs[2 * c], &views[2 * c]) < 0 ||
            alloc_view(alloc, sizes[c] + 16, &objs[2 * c + 1], &views[2 * c + 1]) < 0)
            return -1;
        offs[c] = (int32_t *)views[2 * c].buf;
        datas[c] = (uint8_t *)views[2 * c + 1].buf;
    }
    return 0;
}

static PyObject *py_split(PyObject *self, PyObject *args) {
    Py_buffer bb;
    Py_ssize_t width;
    int skip_empty;
    PyObject *alloc, *kinds_obj = Py_None;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*npO|O", &bb, &width, &skip_empty, &alloc, &kinds_obj))
        return NULL;
    const uint8_t *s = (const uint8_t *)bb.buf;
    PyObject *result = NULL;
    fields f = {NULL, 0, 0, NULL};
    Py_ssize_t rows = 0;
    int32_t **offs = NULL, *at = NULL;
    uint8_t **datas = NULL, *empty = NULL, **vals = NULL, *ok = NULL;
    PyObject **objs = NULL, **val_objs = NULL;
    Py_buffer *views = NULL, *val_views = NULL;
    char *mode = NULL;
    const char *kinds = NULL;
    if (width < 1) {
        PyErr_SetString(PyExc_ValueError, "width must be at least 1");
        goto done;
    }
    if (kinds_obj != Py_None) {
        if (!PyBytes_Check(kinds_obj) || PyBytes_GET_SIZE(kinds_obj) != width) {
            PyErr_SetString(PyExc_ValueError, "kinds must be bytes, one per field position");
            goto done;
        }
        kinds = PyBytes_AS_STRING(kinds_obj);
    }
    if (bb.len == 0 || bb.len >= INT32_MAX) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    f.sizes = calloc((size_t)width, sizeof(Py_ssize_t));
    offs = calloc((size_t)width, sizeof(int32_t *));
    datas = calloc((size_t)width, sizeof(uint8_t *));
    at = calloc((size_t)width, sizeof(int32_t));
    empty = calloc((size_t)width, 1);
    mode = calloc((size_t)width, 1);
    ok = calloc((size_t)width, 1);
    vals = calloc((size_t)width, sizeof(uint8_t *));
    val_objs = calloc((size_t)width, sizeof(PyObject *));
    val_views = calloc((size_t)width, sizeof(Py_buffer));
    objs = calloc((size_t)width * 2, sizeof(PyObject *)); /* offsets, data (16 bytes of slack) per column */
    views = calloc((size_t)width * 2, sizeof(Py_buffer));
    if (!f.sizes || !offs || !datas || !at || !empty || !mode || !ok || !vals || !val_objs || !val_views ||
        !objs || !views) {
        PyErr_NoMemory();
        goto done;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = scan(s, bb.len, width, skip_empty, &f, &rows);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        PyErr_NoMemory();
        goto done;
    }
    if (rc > 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    for (Py_ssize_t c = 0; kinds && c < width; c++) { /* the typed columns' value buffers */
        int size = kind_size(kinds[c]);
        if (!size)
            continue;
        if (alloc_view(alloc, rows * size, &val_objs[c], &val_views[c]) < 0)
            goto done;
        vals[c] = (uint8_t *)val_views[c].buf;
        mode[c] = kinds[c];
        ok[c] = 1;
    }
    if (alloc_texts(alloc, width, rows, f.sizes, mode, objs, views, offs, datas) < 0)
        goto done;
    Py_BEGIN_ALLOW_THREADS
    fill(s, bb.len, &f, width, rows, offs, datas, at, empty, mode, vals, ok);
    Py_END_ALLOW_THREADS
    int again = 0; /* typed columns with a field not of their kind: their texts after all */
    for (Py_ssize_t c = 0; c < width; c++) {
        int redo = mode[c] != COPY && !ok[c];
        mode[c] = redo ? COPY : SKIP;
        again |= redo;
    }
    if (again) {
        if (alloc_texts(alloc, width, rows, f.sizes, mode, objs, views, offs, datas) < 0)
            goto done;
        Py_BEGIN_ALLOW_THREADS
        fill(s, bb.len, &f, width, rows, offs, datas, at, empty, mode, vals, ok);
        Py_END_ALLOW_THREADS
    }
    PyObject *list = PyList_New(width);
    if (!list)
        goto done;
    for (Py_ssize_t c = 0; c < width; c++) {
        PyObject *pair;
        if (ok[c]) {
            pair = PyTuple_Pack(4, Py_None, val_objs[c], Py_False, Py_False);
        } else {
            int backslash = memchr(datas[c], '\\', (size_t)f.sizes[c]) != NULL;
            pair = PyTuple_Pack(4, objs[2 * c], objs[2 * c + 1], backslash ? Py_True : Py_False,
                                empty[c] ? Py_True : Py_False);
        }
        if (!pair) {
            Py_DECREF(list);
            goto done;
        }
        PyList_SET_ITEM(list, c, pair);
    }
    result = list;
done:
    release_bounds(&f);
    free(f.sizes);
    for (Py_ssize_t i = 0; objs && i < 2 * width; i++) {
        if (objs[i]) {
            PyBuffer_Release(&views[i]);
            Py_DECREF(objs[i]);
        }
    }
    for (Py_ssize_t c = 0; val_objs && c < width; c++) {
        if (val_objs[c]) {
            PyBuffer_Release(&val_views[c]);
            Py_DECREF(val_objs[c]);
        }
    }
    free(objs);
    free(views);
    free(val_objs);
    free(val_views);
    free(vals);
    free(offs);
    free(datas);
    free(at);
    free(empty);
    free(mode);
    free(ok);
    PyBuffer_Release(&bb);
    return result;
}

static PyMethodDef module_methods[] = {
    {"split", py_split, METH_VARARGS,
     "split(block, width, skip_empty, alloc, kinds=None) -> [(offsets | None, data, has_backslash, has_empty)] "
     "per field position, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_tsvsplit", "TabSeparated lines split into Arrow binary columns.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__tsvsplit(void) {
    if (pthread_key_create(&bounds_key, free_cache) != 0) {
        PyErr_SetString(PyExc_OSError, "pthread_key_create failed");
        return NULL;
    }
    return PyModule_Create(&module_def);
}
