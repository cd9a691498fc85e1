/*
 * k-way merge of sorted runs, and gathering rows from the runs in merged order.
 *
 * A merge round hands over k runs (a cut of each source part's pending rows), each sorted by the
 * table's sorting key.  Their merged order is ClickHouse's (MergingSortedBlockInputStream): by the key,
 * ties to the lower run number, and inside a run row order.  Key order: ascending; integers by value;
 * floats by value with -0.0 equal to 0.0 and NaN after every number (all NaNs equal); byte strings
 * unsigned byte-wise, a prefix first.
 *
 * Python API (module replicad.native._kmerge):
 *   merge(kinds, runs) -> (sources: bytes, rows: bytes)
 *       kinds: one character per key column: b B h H i I q Q (signed/unsigned 8..64-bit integers), f d
 *       (float32/float64), s S (byte strings with int32/int64 offsets).  runs: a list of tuples, one per
 *       run, with per key column one buffer of the run's values (numbers), or two buffers (strings: the
 *       run's n + 1 offsets into the data buffer, then the data).  sources holds, per merged row, the
 *       run it comes from (int32), rows its row in that run (int32).
 *   gather_fixed(width, runs, sources, rows[, out]) -> bytes (or, into out, the bytes written)
 *       runs: one buffer per run of fixed-width values (width bytes each); returns the values in merged
 *       order: row i is row rows[i] of run sources[i].
 *   gather_binary(runs, sources, rows[, out_offsets, out_data]) -> (offsets, data) (or the data bytes
 *       written into the out buffers: out_data needs room for every row of every run and 32 bytes more)
 *       runs: one (offsets, data) pair per run (n + 1 offsets into data, int32 or int64, all runs
 *       alike); returns the values in merged order as Arrow offsets (starting at 0, the runs' offset
 *       width) and data (sized for every row of every run, and 32 bytes more).
 * All raise ValueError for inconsistent input (sizes, offsets out of order or outside the data, a run
 * asked for more rows than it has) and never read outside the given buffers.  The GIL is released while
 * working on large inputs.
 */
#include "kruns.h"
#include <math.h>

#define MAX_KEYS 64

typedef struct {
    Py_ssize_t n;
    Py_ssize_t pos;
    uint64_t head;             /* the normalized first key column of row pos */
    const uint64_t *normalized; /* one numeric key column: its normalized values (or NULL) */
    uint64_t *owned;           /* ... when they had to be computed */
    key_col cols[MAX_KEYS];
} run_state;

static int kind_width(char kind) {
    switch (kind) {
    case 'b': case 'B': return 1;
    case 'h': case 'H': return 2;
    case 'i': case 'I': case 'f': return 4;
    case 'q': case 'Q': case 'd': return 8;
    default: return 0;
    }
}
static inline uint64_t norm_double(double v) {
    if (isnan(v))
        return UINT64_MAX;
    if (v == 0.0)
        v = 0.0; /* -0.0 sorts as 0.0 */
    uint64_t bits;
    memcpy(&bits, &v, 8);
    return (bits >> 63) ? ~bits : (bits | ((uint64_t)1 << 63));
}

/* An unsigned 64-bit number whose order is the key's order (strings: their first 8 bytes, big-endian,
 * zero-padded: equal prefixes need the full comparison). */
static inline uint64_t norm(const key_col *c, Py_ssize_t i) {
    const uint8_t *p = c->data;
    switch (c->kind) {
    case 'B': return p[i];
    case 'H': { uint16_t v; memcpy(&v, p + 2 * i, 2); return v; }
    case 'I': { uint32_t v; memcpy(&v, p + 4 * i, 4); return v; }
    case 'Q': { uint64_t v; memcpy(&v, p + 8 * i, 8); return v; }
    case 'b': return (uint64_t)(int64_t)(int8_t)p[i] ^ ((uint64_t)1 << 63);
    case 'h': { int16_t v; memcpy(&v, p + 2 * i, 2); return (uint64_t)(int64_t)v ^ ((uint64_t)1 << 63); }
    case 'i': { int32_t v; memcpy(&v, p + 4 * i, 4); return (uint64_t)(int64_t)v ^ ((uint64_t)1 << 63); }
    case 'q': { int64_t v; memcpy(&v, p + 8 * i, 8); return (uint64_t)v ^ ((uint64_t)1 << 63); }
    case 'f': { float v; memcpy(&v, p + 4 * i, 4); return norm_double((double)v); }
    case 'd': { double v; memcpy(&v, p + 8 * i, 8); return norm_double(v); }
    default: {
        int64_t a = str_offset(c, i), b = str_offset(c, i + 1);
        int64_t len = b - a < 8 ? b - a : 8;
        uint64_t v = 0;
        for (int64_t j = 0; j < len; j++)
            v |= (uint64_t)p[a + j] << (56 - 8 * j);
        return v;
    }
    }
}

static inline int is_string(char kind) { return kind == 's' || kind == 'S'; }

/* <0, 0, >0: row i of column a against row j of column b (same kind). */
static inline int compare_col(const key_col *a, Py_ssize_t i, const key_col *b, Py_ssize_t j) {
    if (is_string(a->kind)) {
        int64_t a0 = str_offset(a, i), a1 = str_offset(a, i + 1);
        int64_t b0 = str_offset(b, j), b1 = str_offset(b, j + 1);
        int64_t la = a1 - a0, lb = b1 - b0;
        int c = memcmp(a->data + a0, b->data + b0, (size_t)(la < lb ? la : lb));
        if (c)
            return c;
        return la < lb ? -1 : la > lb;
    }
    uint64_t x = norm(a, i), y = norm(b, j);
    return x < y ? -1 : x > y;
}

typedef struct {
    run_state *runs;
    int nkeys;
    int first_full; /* first key column compared in full after equal heads (0 for a string) */
    int full;       /* equal heads need the full comparison (several key columns, or a string) */
    int k;
} merger;

/* A run's head as a tournament tree holds it: the normalized first key column, the run number (k and
 * above: an exhausted run, after every other). */
typedef struct {
    uint64_t key;
    int64_t run;
} entry;

#define EXHAUSTED ((int64_t)1 << 40)

/* Whether entry a goes before entry b: by key, then (equal heads) the other key columns, then run. */
static inline int before(const merger *m, entry a, entry b) {
    if (a.key != b.key)
        return a.key < b.key;
    if (m->full && a.run < m->k && b.run < m->k) {
        const run_state *ra = &m->runs[a.run], *rb = &m->runs[b.run];
        for (int c = m->first_full; c < m->nkeys; c++) {
            int r = compare_col(&ra->cols[c], ra->pos, &rb->cols[c], rb->pos);
            if (r)
                return r < 0;
        }
    }
    return a.run < b.run;
}

static inline entry head_of(const merger *m, int64_t r) {
    entry e;
    const run_state *rs = &m->runs[r];
    if (rs->pos < rs->n) {
        e.key = norm(&rs->cols[0], rs->pos);
        e.run = r;
    } else {
        e.key = UINT64_MAX;
        e.run = EXHAUSTED + r;
    }
    return e;
}

/* run_merge for one numeric key column (the runs' normalized values given): a winner tree of (value,
 * run) pairs compared without branches on the data. */
static void run_merge_numeric(const merger *m, entry *tree, int size, int32_t *sources, int32_t *rows) {
    int k = m->k;
    run_state *runs = m->runs;
    for (int i = 0; i < size; i++) {
        if (i < k && runs[i].n > 0) {
            tree[size + i].key = runs[i].normalized[0];
            tree[size + i].run = i;
        } else {
            tree[size + i].key = UINT64_MAX;
            tree[size + i].run = EXHAUSTED + i;
        }
    }
    for (int i = size - 1; i >= 1; i--) {
        entry a = tree[2 * i], b = tree[2 * i + 1];
        tree[i] = (b.key < a.key || (b.key == a.key && b.run < a.run)) ? b : a;
    }
    Py_ssize_t out = 0;
    while (tree[1].run < k) {
        int64_t w = tree[1].run;
        run_state *r = &runs[w];
        Py_ssize_t pos = r->pos;
        sources[out] = (int32_t)w;
        rows[out] = (int32_t)pos;
        out++;
        r->pos = ++pos;
        entry v;
        if (pos < r->n) {
            v.key = r->normalized[pos];
            v.run = w;
        } else {
            v.key = UINT64_MAX;
            v.run = EXHAUSTED + w;
        }
        int i = size + (int)w;
        tree[i] = v;
        while (i > 1) {
            entry sib = tree[i ^ 1];
            uint64_t take =
                (uint64_t)0 - (uint64_t)((sib.key < v.key) | ((sib.key == v.key) & (sib.run < v.run)));
            v.key ^= (v.key ^ sib.key) & take;
            v.run ^= (v.run ^ sib.run) & (int64_t)take;
            i >>= 1;
            tree[i] = v;
        }
    }
}

/* run_merge_numeric when every value minus the smallest, shifted left by ``bits``, fits in 64 bits with
 * the run number in the low ``bits`` (run numbers below 2**bits - 1): a head is one number, ordered as
 * (value, run), and the tree compares numbers; UINT64_MAX marks an exhausted run. */
static void run_merge_packed(const merger *m, uint64_t *tree, int size, int32_t *sources, int32_t *rows,
                             uint64_t lo, int bits) {
    int k = m->k;
    run_state *runs = m->runs;
    uint64_t mask = ((uint64_t)1 << bits) - 1;
    for (int i = 0; i < size; i++)
        tree[size + i] = i < k && runs[i].n > 0 ? ((runs[i].normalized[0] - lo) << bits) | (uint64_t)i
                                                : UINT64_MAX;
    for (int i = size - 1; i >= 1; i--)
        tree[i] = tree[2 * i] < tree[2 * i + 1] ? tree[2 * i] : tree[2 * i + 1];
    Py_ssize_t out = 0;
    while (tree[1] != UINT64_MAX) {
        int w = (int)(tree[1] & mask);
        run_state *r = &runs[w];
        Py_ssize_t pos = r->pos;
        sources[out] = w;
        rows[out] = (int32_t)pos;
        out++;
        r->pos = ++pos;
        uint64_t v = pos < r->n ? ((r->normalized[pos] - lo) << bits) | (uint64_t)w : UINT64_MAX;
        int i = size + w;
        tree[i] = v;
        while (i > 1) {
            uint64_t sib = tree[i ^ 1];
            v = sib < v ? sib : v;
            i >>= 1;
            tree[i] = v;
        }
    }
}

/* A winner tree over the runs' heads: node i holds the first of its two children (leaves: size + run). */
static void run_merge(const merger *m, entry *tree, int size, int32_t *sources, int32_t *rows) {
    int k = m->k;
    for (int i = 0; i < size; i++) {
        if (i < k) {
            tree[size + i] = head_of(m, i);
        } else {
            tree[size + i].key = UINT64_MAX;
            tree[size + i].run = EXHAUSTED + i;
        }
    }
    for (int i = size - 1; i >= 1; i--)
        tree[i] = before(m, tree[2 * i], tree[2 * i + 1]) ? tree[2 * i] : tree[2 * i + 1];
    Py_ssize_t out = 0;
    while (tree[1].run < k) {
        int64_t w = tree[1].run;
        run_state *r = &m->runs[w];
        sources[out] = (int32_t)w;
        rows[out] = (int32_t)r->pos;
        out++;
        r->pos++;
        entry v = head_of(m, w);
        int i = size + (int)w;
        tree[i] = v;
        while (i > 1) {
            entry sib = tree[i ^ 1];
            if (before(m, sib, v))
                v = sib;
            i >>= 1;
            tree[i] = v;
        }
    }
}
static PyObject *py_merge(PyObject *self, PyObject *args) {
    const char *kinds;
    Py_ssize_t nkeys;
    PyObject *runs_obj;
    (void)self;
    if (!PyArg_ParseTuple(args, "s#O!", &kinds, &nkeys, &PyList_Type, &runs_obj))
        return NULL;
    if (nkeys < 1 || nkeys > MAX_KEYS) {
        PyErr_SetString(PyExc_ValueError, "need 1 to 64 key columns");
        return NULL;
    }
    int slots = 0;
    for (Py_ssize_t c = 0; c < nkeys; c++) {
        if (is_string(kinds[c]))
            slots += 2;
        else if (kind_width(kinds[c]))
            slots += 1;
        else {
            PyErr_Format(PyExc_ValueError, "unknown key kind %c", kinds[c]);
            return NULL;
        }
    }
    Py_ssize_t k = PyList_GET_SIZE(runs_obj);
    if (k < 1 || k > (1 << 20)) {
        PyErr_SetString(PyExc_ValueError, "need 1 to 2**20 runs");
        return NULL;
    }
    run_state *runs = PyMem_Calloc((size_t)k, sizeof(run_state));
    Py_buffer *views = PyMem_Calloc((size_t)(k * slots), sizeof(Py_buffer));
    Py_ssize_t got = 0; /* views acquired */
    PyObject *result = NULL, *src_obj = NULL;
    entry *tree = NULL;
    PyObject *rows_obj = NULL;
    if (!runs || !views) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t r = 0; r < k; r++) {
        PyObject *t = PyList_GET_ITEM(runs_obj, r);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != slots) {
            PyErr_Format(PyExc_ValueError, "run %zd: expected a tuple of %d buffers", r, slots);
            goto done;
        }
        int s = 0;
        Py_ssize_t n = -1;
        for (Py_ssize_t c = 0; c < nkeys; c++) {
            key_col *col = &runs[r].cols[c];
            col->kind = kinds[c];
            Py_ssize_t rows;
            if (is_string(kinds[c])) {
                Py_buffer *ov = &views[got], *dv = &views[got + 1];
                if (get_buffer(PyTuple_GET_ITEM(t, s), ov) < 0)
                    goto done;
                got++;
                if (get_buffer(PyTuple_GET_ITEM(t, s + 1), dv) < 0)
                    goto done;
                got++;
                s += 2;
                int w = kinds[c] == 's' ? 4 : 8;
                if (ov->len % w || ov->len < w) {
                    PyErr_Format(PyExc_ValueError, "run %zd: bad offsets buffer size %zd", r, ov->len);
                    goto done;
                }
                rows = ov->len / w - 1;
                col->offsets = ov->buf;
                col->data = dv->buf;
                col->data_len = dv->len;
                if (check_offsets(col, rows) < 0) {
                    PyErr_Format(PyExc_ValueError, "run %zd: offsets out of order or outside the data", r);
                    goto done;
                }
            } else {
                Py_buffer *v = &views[got];
                if (get_buffer(PyTuple_GET_ITEM(t, s), v) < 0)
                    goto done;
                got++;
                s += 1;
                int w = kind_width(kinds[c]);
                if (v->len % w) {
                    PyErr_Format(PyExc_ValueError, "run %zd: buffer size %zd is not a multiple of %d", r,
                                 v->len, w);
                    goto done;
                }
                rows = v->len / w;
                col->data = v->buf;
                col->data_len = v->len;
            }
            if (n >= 0 && rows != n) {
                PyErr_Format(PyExc_ValueError, "run %zd: key columns of %zd and %zd rows", r, n, rows);
                goto done;
            }
            n = rows;
        }
        if (n > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "run %zd: more than 2**31 - 1 rows", r);
            goto done;
        }
        runs[r].n = n;
        total += n;
        if (n > 0)
            runs[r].head = norm(&runs[r].cols[0], 0);
    }
    int size = 1;
    while (size < k)
        size <<= 1;
    tree = PyMem_Calloc((size_t)(2 * size), sizeof(entry));
    if (!tree) {
        PyErr_NoMemory();
        goto done;
    }
    src_obj = PyBytes_FromStringAndSize(NULL, total * 4);
    rows_obj = PyBytes_FromStringAndSize(NULL, total * 4);
    if (!src_obj || !rows_obj)
        goto done;
    merger m = {runs, (int)nkeys, is_string(kinds[0]) ? 0 : 1, nkeys > 1 || is_string(kinds[0]), (int)k};
    if (!m.full) {
        for (Py_ssize_t r = 0; r < k; r++) {
            key_col *c = &runs[r].cols[0];
            if (c->kind == 'Q' && ((uintptr_t)c->data % 8) == 0) {
                runs[r].normalized = (const uint64_t *)c->data;
                continue;
            }
            runs[r].owned = PyMem_Malloc((size_t)(runs[r].n ? runs[r].n : 1) * sizeof(uint64_t));
            if (!runs[r].owned) {
                PyErr_NoMemory();
                goto done;
            }
            for (Py_ssize_t i = 0; i < runs[r].n; i++)
                runs[r].owned[i] = norm(c, i);
            runs[r].normalized = runs[r].owned;
        }
    }
    int32_t *sources = (int32_t *)PyBytes_AS_STRING(src_obj);
    int32_t *rows_out = (int32_t *)PyBytes_AS_STRING(rows_obj);
    /* one numeric key whose range leaves room for the run number: packed heads */
    int bits = 1;
    while (((Py_ssize_t)1 << bits) - 1 <= k)
        bits++;
    uint64_t lo = UINT64_MAX, hi = 0;
    if (!m.full) {
        for (Py_ssize_t r = 0; r < k; r++) {
            if (runs[r].n == 0)
                continue;
            uint64_t first = runs[r].normalized[0], last = runs[r].normalized[runs[r].n - 1];
            lo = first < lo ? first : lo;
            hi = last > hi ? last : hi;
        }
    }
    int packed = !m.full && bits < 64 && (lo > hi || ((hi - lo) >> (64 - bits)) == 0);
    if (total >= GIL_THRESHOLD) {
        Py_BEGIN_ALLOW_THREADS
        if (packed)
            run_merge_packed(&m, (uint64_t *)tree, size, sources, rows_out, lo, bits);
        else
            (m.full ? run_merge : run_merge_numeric)(&m, tree, size, sources, rows_out);
        Py_END_ALLOW_THREADS
    } else {
        if (packed)
            run_merge_packed(&m, (uint64_t *)tree, size, sources, rows_out, lo, bits);
        else
            (m.full ? run_merge : run_merge_numeric)(&m, tree, size, sources, rows_out);
    }
    result = PyTuple_Pack(2, src_obj, rows_obj);
done:
    Py_XDECREF(src_obj);
    Py_XDECREF(rows_obj);
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    if (runs)
        for (Py_ssize_t r = 0; r < k; r++)
            PyMem_Free(runs[r].owned);
    PyMem_Free(views);
    PyMem_Free(runs);
    PyMem_Free(tree);
    return result;
}
static PyMethodDef module_methods[] = {
    {"merge", py_merge, METH_VARARGS,
     "merge(kinds, runs) -> (sources, rows): the merged order of sorted runs (int32 run and row in it per "
     "merged row)."},
    {"gather_fixed", py_gather_fixed, METH_VARARGS,
     "gather_fixed(width, runs, sources, rows) -> bytes: fixed-width values of the runs in merged order."},
    {"gather_binary", py_gather_binary, METH_VARARGS,
     "gather_binary(runs, sources, rows) -> (offsets, data): byte strings of the runs in merged order."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_kmerge", "k-way merge of sorted runs, and gathering rows in merged order.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kmerge(void) {
    PyObject *m = PyModule_Create(&module_def);
    if (m && PyModule_AddIntConstant(m, "SLACK", SLACK) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
