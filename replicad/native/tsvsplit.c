/*
 * A block of TabSeparated lines split into one Arrow `binary` column per field position, the raw field
 * bytes copied once (no unescaping: that stays with the caller).
 *
 * Python API (module replicad.native._tsvsplit):
 *   split(block, width, skip_empty, alloc) -> list[tuple[offsets, data, has_backslash, has_empty]] | None
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
 * The GIL is released while splitting.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <emmintrin.h> /* SSE2: part of x86-64 */
#include <pthread.h>

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

/* Copies the fields row by row, each column to its own cursor; every data buffer has 16 bytes of slack
 * (short fields are copied 16 bytes at a time when the block has 16 bytes left to read). */
static void fill(const uint8_t *s, Py_ssize_t len, const fields *f, Py_ssize_t width, Py_ssize_t rows,
                 int32_t **offsets, uint8_t **data, int32_t *at, uint8_t *empty) {
    const int32_t *b = f->bounds;
    for (Py_ssize_t c = 0; c < width; c++) {
        offsets[c][0] = 0;
        at[c] = 0;
    }
    for (Py_ssize_t r = 0; r < rows; r++) {
        for (Py_ssize_t c = 0; c < width; c++, b += 2) {
            int32_t n = b[1] - b[0];
            const uint8_t *src = s + b[0];
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
        memset(data[c] + at[c], 0, 16); /* the slack holds no stray bytes (copied or left by the allocator) */
}

static PyObject *py_split(PyObject *self, PyObject *args) {
    Py_buffer bb;
    Py_ssize_t width;
    int skip_empty;
    PyObject *alloc;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*npO", &bb, &width, &skip_empty, &alloc))
        return NULL;
    const uint8_t *s = (const uint8_t *)bb.buf;
    PyObject *result = NULL;
    fields f = {NULL, 0, 0, NULL};
    Py_ssize_t rows = 0;
    int32_t **offs = NULL, *at = NULL;
    uint8_t **datas = NULL, *empty = NULL;
    PyObject **objs = NULL;
    Py_buffer *views = NULL;
    Py_ssize_t n_views = 0;
    if (width < 1) {
        PyErr_SetString(PyExc_ValueError, "width must be at least 1");
        goto done;
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
    if (!f.sizes || !offs || !datas || !at || !empty) {
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
    objs = calloc((size_t)width * 2, sizeof(PyObject *)); /* offsets, data (16 bytes of slack) per column */
    views = calloc((size_t)width * 2, sizeof(Py_buffer));
    if (!objs || !views) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < 2 * width; i++) {
        Py_ssize_t c = i / 2, size = i % 2 ? f.sizes[c] + 16 : (rows + 1) * 4;
        objs[i] = PyObject_CallFunction(alloc, "n", size);
        if (!objs[i] || PyObject_GetBuffer(objs[i], &views[i], PyBUF_WRITABLE) < 0)
            goto done;
        n_views = i + 1;
        if (views[i].len < size) {
            PyErr_SetString(PyExc_ValueError, "alloc returned a buffer too short");
            goto done;
        }
        if (i % 2)
            datas[c] = (uint8_t *)views[i].buf;
        else
            offs[c] = (int32_t *)views[i].buf;
    }
    for (Py_ssize_t c = 0; c < width; c++) {
        if (((uintptr_t)offs[c]) % 4) {
            PyErr_SetString(PyExc_ValueError, "alloc returned a buffer not 4-byte aligned");
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    fill(s, bb.len, &f, width, rows, offs, datas, at, empty);
    Py_END_ALLOW_THREADS
    PyObject *list = PyList_New(width);
    if (!list)
        goto done;
    for (Py_ssize_t c = 0; c < width; c++) {
        int backslash = memchr(datas[c], '\\', (size_t)f.sizes[c]) != NULL;
        PyObject *pair = PyTuple_Pack(4, objs[2 * c], objs[2 * c + 1], backslash ? Py_True : Py_False,
                                      empty[c] ? Py_True : Py_False);
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
    for (Py_ssize_t i = 0; i < n_views; i++)
        PyBuffer_Release(&views[i]);
    free(views);
    if (objs)
        for (Py_ssize_t i = 0; i < 2 * width; i++)
            Py_XDECREF(objs[i]);
    free(objs);
    free(offs);
    free(datas);
    free(at);
    free(empty);
    PyBuffer_Release(&bb);
    return result;
}

static PyMethodDef module_methods[] = {
    {"split", py_split, METH_VARARGS,
     "split(block, width, skip_empty, alloc) -> [(offsets, data, has_backslash)] per field position, or None."},
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
