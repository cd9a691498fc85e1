/*
 * The column streams of a part held whole in memory (an insert block's part), serialized, cut into
 * compressed blocks, compressed and hashed in one call, with their marks: what PartWriter
 * (replicad/storage/writer.py, column_writer.py) does with a stream object, a block writer and two running
 * hashes per substream fed granule by granule, and what replicad/storage/small_part.py did per stream with
 * ~a dozen Python-level calls each.
 *
 * Python API (module replicad.native._wholepart):
 *   seal_streams(streams, order, method, level, max_block, rows, granule, min_block) -> list
 *     ``streams``: a sequence of (kind, a, b):
 *       (0, data, starts)       RAW: ``data`` is the stream's serialized rows as they are (``order`` unused);
 *                               ``starts`` the byte offset in ``data`` where each granule starts (int64
 *                               values, the first 0), or 0 when the part has one granule or ``data`` is
 *                               empty;
 *       (1, rows, width)        FIXED: ``rows`` holds rows of ``width`` bytes one after another;
 *       (2, offsets, data)      STRING: Arrow binary buffers, ``offsets`` int32 (rows + 1 of them, native
 *                               order, absolute positions in ``data``); each row serialized as ClickHouse's
 *                               String: VarUInt length, then the bytes;
 *       (3, rows, 0)            NARROW_4_2: int32 rows, each serialized as its low 16 bits (numpy's
 *                               astype(uint16): Arrow date32 days as ClickHouse's Date);
 *       (4, rows, 0)            NARROW_8_4: int64 rows, each serialized as its low 32 bits (Arrow
 *                               timestamp[s] seconds as DateTime).
 *     ``order``: None (rows in their order) or a contiguous int64 buffer of row numbers: all but RAW
 *     streams serialize those rows in that order (each row number must be a row: ValueError otherwise).
 *     ``rows``: the part's rows (>= 1; the order's length, or each FIXED/STRING/NARROW stream's rows);
 *     ``granule``: rows per granule (index_granularity); the part has ceil(rows / granule) granules.
 *     ``method``: the block's method byte, 0x02 (none), 0x82 (LZ4_compress_default) or 0x90
 *     (ZSTD_compressCCtx at ``level``), the libraries loaded from the system (liblz4.so.1, libzstd.so.1,
 *     as replicad/storage/compression.py's blocks: the same bytes); OSError if one cannot be loaded.
 *     Blocks are cut as PartWriter's streams cut them (ClickHouse's rule): before each granule the
 *     pending bytes become a block if there are ``min_block`` or more of them, and a block is cut whenever
 *     ``max_block`` bytes are pending, mid-granule too.
 *     For each stream, in order, (body, body_hash, size, hash, marks): the ``.bin`` file (its compressed
 *     blocks, each: 16-byte CityHash128 of the rest, method byte, UInt32 compressed size with the 9-byte
 *     header, UInt32 size, payload; b"" for an empty stream), its file hash, the serialized size, the
 *     serialized bytes' file hash (ClickHouse's chained hash of checksums.txt) and the ``.mrk`` file (per
 *     granule: UInt64 offset of its block in the ``.bin``, UInt64 offset of its first row in the block).
 *     The GIL is let go for the work when the streams hold at least 256 KiB.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cityhash102_core.h"
#include "system_codecs.h"

#define KIND_RAW 0
#define KIND_FIXED 1
#define KIND_STRING 2
#define KIND_NARROW_4_2 3
#define KIND_NARROW_8_4 4

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the serialized rows are little-endian: this file takes the host's order to be that"
#endif

#define NOGIL_BYTES (256 * 1024)

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void u128_out(u128 v, uint8_t *out) {
    for (int i = 0; i < 8; i++) {
        out[i] = (uint8_t)(v.lo >> (8 * i));
        out[8 + i] = (uint8_t)(v.hi >> (8 * i));
    }
}

/* ------------------------------------------------------------------ the streams */

typedef struct {
    size_t start, size;  /* the block's serialized bytes */
    size_t at;           /* its offset in the .bin file (known once the blocks before it are compressed) */
} block;

typedef struct {
    int kind;
    Py_buffer a, b;
    int have_a, have_b;
    Py_ssize_t width;     /* FIXED, NARROW_*: bytes per row in the buffer */
    Py_ssize_t out_width; /* FIXED, NARROW_*: bytes per serialized row */
    Py_ssize_t rows;      /* FIXED, STRING, NARROW_*: rows in the buffers */
    size_t plain_size;    /* serialized size */
    uint8_t *plain;       /* serialized rows (malloc), or NULL: RAW's own buffer */
    size_t *starts;       /* where each granule starts in the serialized rows (malloc) */
    block *blocks;        /* the compressed blocks (malloc) */
    Py_ssize_t n_blocks;
    Py_ssize_t *mark_block; /* each granule's block (malloc) */
    uint8_t *marks;       /* the .mrk file (malloc) */
    uint8_t *body;        /* the .bin file (malloc) */
    size_t body_cap, body_size;
    uint8_t body_hash[16], plain_hash[16];
} stream;

static size_t varuint_size(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static uint8_t *put_varuint(uint8_t *p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* (GIL held) check a stream's buffers (and the order, the granule starts) against its rows; its
 * serialized size and where each of its ``n_gran`` granules of ``granule`` rows starts */
static int size_stream(stream *s, const int64_t *order, Py_ssize_t rows, int have_order, Py_ssize_t granule,
                       Py_ssize_t n_gran) {
    s->starts = malloc((size_t)n_gran * sizeof(size_t));
    if (s->starts == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (s->kind == KIND_RAW) {
        s->plain_size = (size_t)s->a.len;
        if (!s->have_b) { /* one granule, or none of the granules has a byte */
            if (n_gran != 1 && s->plain_size) {
                PyErr_SetString(PyExc_ValueError,
                                "seal_streams: a RAW stream of many granules without their starts");
                return -1;
            }
            memset(s->starts, 0, (size_t)n_gran * sizeof(size_t));
            return 0;
        }
        if (s->b.len != n_gran * 8) {
            PyErr_SetString(PyExc_ValueError,
                            "seal_streams: a RAW stream's starts are not one int64 a granule");
            return -1;
        }
        const int64_t *given = (const int64_t *)s->b.buf;
        for (Py_ssize_t g = 0; g < n_gran; g++) {
            if ((g == 0 && given[0] != 0) || (g > 0 && given[g] < given[g - 1]) ||
                given[g] > (int64_t)s->plain_size) {
                PyErr_SetString(PyExc_ValueError, "seal_streams: a RAW stream's starts are not its granules'");
                return -1;
            }
            s->starts[g] = (size_t)given[g];
        }
        return 0;
    }
    if (s->kind != KIND_STRING) {
        if (s->width <= 0 || s->a.len % s->width) {
            PyErr_SetString(PyExc_ValueError, "seal_streams: the rows are not a whole number of widths");
            return -1;
        }
        s->rows = s->a.len / s->width;
    } else {
        if (s->a.len < 4 || s->a.len % 4) {
            PyErr_SetString(PyExc_ValueError, "seal_streams: STRING offsets are not int32 values");
            return -1;
        }
        s->rows = s->a.len / 4 - 1;
    }
    if (!have_order && s->rows != rows) {
        PyErr_Format(PyExc_ValueError, "seal_streams: a stream of %zd rows in a part of %zd", s->rows, rows);
        return -1;
    }
    for (Py_ssize_t i = 0; have_order && i < rows; i++)
        if (order[i] < 0 || order[i] >= s->rows) {
            PyErr_Format(PyExc_ValueError, "seal_streams: row %lld of the order is not a row (%zd rows)",
                         (long long)order[i], s->rows);
            return -1;
        }
    if (s->kind != KIND_STRING) {
        s->plain_size = (size_t)rows * (size_t)s->out_width;
        for (Py_ssize_t g = 0; g < n_gran; g++)
            s->starts[g] = (size_t)g * (size_t)granule * (size_t)s->out_width;
        return 0;
    }
    const int32_t *off = (const int32_t *)s->a.buf;
    if (off[0] < 0 || off[s->rows] > s->b.len) {
        PyErr_SetString(PyExc_ValueError, "seal_streams: STRING offsets outside the data");
        return -1;
    }
    size_t total = 0;
    for (Py_ssize_t i = 0; i < rows; i++) {
        if (i % granule == 0)
            s->starts[i / granule] = total;
        Py_ssize_t r = have_order ? (Py_ssize_t)order[i] : i;
        int32_t len = off[r + 1] - off[r];
        if (len < 0 || off[r] < 0 || off[r + 1] > s->b.len) {
            PyErr_SetString(PyExc_ValueError, "seal_streams: STRING offsets decrease or leave the data");
            return -1;
        }
        total += varuint_size((uint64_t)len) + (size_t)len;
    }
    s->plain_size = total;
    return 0;
}

/* (no Python) serialize a FIXED/STRING/NARROW_* stream's ``n`` rows into s->plain */
static void serialize_stream(stream *s, const int64_t *order, Py_ssize_t n, int have_order) {
    uint8_t *p = s->plain;
    if (s->kind == KIND_NARROW_4_2 || s->kind == KIND_NARROW_8_4) {
        const uint8_t *rows = (const uint8_t *)s->a.buf;
        size_t w = (size_t)s->width, ow = (size_t)s->out_width;
        for (Py_ssize_t i = 0; i < n; i++, p += ow)
            memcpy(p, rows + (size_t)(have_order ? order[i] : i) * w, ow); /* the low bytes (little-endian) */
        return;
    }
    if (s->kind == KIND_FIXED) {
        const uint8_t *rows = (const uint8_t *)s->a.buf;
        size_t w = (size_t)s->width;
        if (!have_order) {
            memcpy(p, rows, (size_t)n * w);
        } else if (w == 8) {
            for (Py_ssize_t i = 0; i < n; i++, p += 8)
                memcpy(p, rows + (size_t)order[i] * 8, 8);
        } else if (w == 4) {
            for (Py_ssize_t i = 0; i < n; i++, p += 4)
                memcpy(p, rows + (size_t)order[i] * 4, 4);
        } else if (w == 2) {
            for (Py_ssize_t i = 0; i < n; i++, p += 2)
                memcpy(p, rows + (size_t)order[i] * 2, 2);
        } else if (w == 1) {
            for (Py_ssize_t i = 0; i < n; i++)
                *p++ = rows[order[i]];
        } else {
            for (Py_ssize_t i = 0; i < n; i++, p += w)
                memcpy(p, rows + (size_t)order[i] * w, w);
        }
        return;
    }
    const int32_t *off = (const int32_t *)s->a.buf;
    const uint8_t *data = (const uint8_t *)s->b.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t r = have_order ? (Py_ssize_t)order[i] : i;
        size_t len = (size_t)(off[r + 1] - off[r]);
        p = put_varuint(p, len);
        memcpy(p, data + off[r], len);
        p += len;
    }
}

/* (GIL held) the stream's blocks, cut as PartWriter's stream cuts them, each granule's block, the .bin's
 * room; -1 with MemoryError */
static int cut_blocks(stream *s, Py_ssize_t n_gran, int method, size_t min_block, size_t max_block) {
    size_t most = s->plain_size / max_block + (size_t)n_gran + 1;
    s->blocks = malloc(most * sizeof(block));
    s->mark_block = malloc((size_t)n_gran * sizeof(Py_ssize_t));
    s->marks = malloc((size_t)n_gran * 16);
    if (s->blocks == NULL || s->mark_block == NULL || s->marks == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    size_t from = 0; /* where the pending bytes start */
    Py_ssize_t nb = 0;
    for (Py_ssize_t g = 0; g < n_gran; g++) {
        size_t at = s->starts[g];
        for (; at - from >= max_block; from += max_block)
            s->blocks[nb++] = (block){from, max_block, 0};
        if (at > from && at - from >= min_block) {
            s->blocks[nb++] = (block){from, at - from, 0};
            from = at;
        }
        s->mark_block[g] = nb; /* the block the granule's first row is in: the next one cut */
    }
    for (; s->plain_size - from >= max_block; from += max_block)
        s->blocks[nb++] = (block){from, max_block, 0};
    if (s->plain_size > from)
        s->blocks[nb++] = (block){from, s->plain_size - from, 0};
    s->n_blocks = nb;
    size_t cap = 0;
    for (Py_ssize_t i = 0; i < nb; i++)
        cap += OVERHEAD + payload_bound(method, s->blocks[i].size);
    s->body_cap = cap;
    if (cap > 0) {
        s->body = malloc(cap);
        if (s->body == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
}

/* (no Python) the stream's blocks compressed into its .bin, its marks and hashes; -1 when compression
 * failed */
static int seal_stream(stream *s, Py_ssize_t n_gran, int method, int level) {
    const uint8_t *plain = s->plain != NULL ? s->plain : (const uint8_t *)s->a.buf;
    u128_out(whole_file_hash(plain, s->plain_size), s->plain_hash);
    size_t at = 0;
    for (Py_ssize_t i = 0; i < s->n_blocks; i++) {
        block *b = &s->blocks[i];
        uint8_t *out = s->body + at;
        size_t size = compress_payload(method, level, plain + b->start, b->size, out + OVERHEAD,
                                       s->body_cap - at - OVERHEAD);
        if (size == (size_t)-1)
            return -1;
        uint8_t *h = out + CHECKSUM_SIZE;
        h[0] = (uint8_t)method;
        put_u32(h + 1, (uint32_t)(size + HEADER_SIZE));
        put_u32(h + 5, (uint32_t)b->size);
        u128_out(ch128(h, size + HEADER_SIZE), out);
        b->at = at;
        at += size + OVERHEAD;
    }
    s->body_size = at;
    if (at)
        u128_out(whole_file_hash(s->body, at), s->body_hash);
    else
        memset(s->body_hash, 0, 16);
    for (Py_ssize_t g = 0; g < n_gran; g++) {
        Py_ssize_t k = s->mark_block[g];
        size_t block_at = k < s->n_blocks ? s->blocks[k].at : at;
        size_t block_start = k < s->n_blocks ? s->blocks[k].start : s->plain_size;
        put_u64(s->marks + 16 * g, block_at);
        put_u64(s->marks + 16 * g + 8, s->starts[g] - block_start);
    }
    return 0;
}

static void release_streams(stream *ss, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if (ss[i].have_a)
            PyBuffer_Release(&ss[i].a);
        if (ss[i].have_b)
            PyBuffer_Release(&ss[i].b);
        free(ss[i].plain);
        free(ss[i].starts);
        free(ss[i].blocks);
        free(ss[i].mark_block);
        free(ss[i].marks);
        free(ss[i].body);
    }
    PyMem_Free(ss);
}

static PyObject *seal_streams(PyObject *self, PyObject *args) {
    PyObject *streams, *order_obj, *seq, *out = NULL;
    int method, level;
    Py_ssize_t max_block, rows, granule, min_block;
    Py_buffer order;
    int have_order = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOiinnnn", &streams, &order_obj, &method, &level, &max_block, &rows,
                          &granule, &min_block))
        return NULL;
    if (rows < 1 || granule < 1 || max_block < 1 || min_block < 0) {
        PyErr_SetString(PyExc_ValueError, "seal_streams: rows, granule and max_block are at least 1");
        return NULL;
    }
    if (load_method(method) < 0)
        return NULL;
    Py_ssize_t n_gran = (rows + granule - 1) / granule;
    seq = PySequence_Fast(streams, "seal_streams: streams must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    stream *ss = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(stream));
    if (ss == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    if (order_obj != Py_None) {
        if (PyObject_GetBuffer(order_obj, &order, PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        have_order = 1;
        if (order.len % 8 || order.len / 8 != rows) {
            PyErr_SetString(PyExc_ValueError, "seal_streams: the order is not one int64 value a row");
            goto done;
        }
    }
    const int64_t *rows_order = have_order ? (const int64_t *)order.buf : NULL;
    size_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        stream *s = &ss[i];
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) {
            PyErr_SetString(PyExc_TypeError, "seal_streams: each stream is a (kind, a, b) tuple");
            goto done;
        }
        s->kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(item, 0));
        if (s->kind == -1 && PyErr_Occurred())
            goto done;
        if (s->kind < KIND_RAW || s->kind > KIND_NARROW_8_4) {
            PyErr_Format(PyExc_ValueError, "seal_streams: unknown stream kind %d", s->kind);
            goto done;
        }
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(item, 1), &s->a, PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        s->have_a = 1;
        PyObject *b = PyTuple_GET_ITEM(item, 2);
        if (s->kind == KIND_STRING || (s->kind == KIND_RAW && !PyLong_Check(b))) {
            if (PyObject_GetBuffer(b, &s->b, PyBUF_C_CONTIGUOUS) < 0)
                goto done;
            s->have_b = 1;
        } else if (s->kind == KIND_FIXED) {
            s->width = s->out_width = PyLong_AsSsize_t(b);
            if (s->width == -1 && PyErr_Occurred())
                goto done;
        } else if (s->kind == KIND_NARROW_4_2) {
            s->width = 4;
            s->out_width = 2;
        } else if (s->kind == KIND_NARROW_8_4) {
            s->width = 8;
            s->out_width = 4;
        }
        if (size_stream(s, rows_order, rows, have_order, granule, n_gran) < 0)
            goto done;
        if (s->plain_size > 0x7E000000) {
            PyErr_SetString(PyExc_ValueError, "seal_streams: a stream of 2 GiB or more");
            goto done;
        }
        if (s->kind != KIND_RAW && s->plain_size > 0) {
            s->plain = malloc(s->plain_size);
            if (s->plain == NULL) {
                PyErr_NoMemory();
                goto done;
            }
        }
        if (cut_blocks(s, n_gran, method, (size_t)min_block, (size_t)max_block) < 0)
            goto done;
        total += s->plain_size;
    }
    int failed = 0;
    /* below NOGIL_BYTES the GIL is kept: handing it over and winning it back costs more than the work */
    PyThreadState *released = total >= NOGIL_BYTES ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < n && !failed; i++) {
        stream *s = &ss[i];
        if (s->kind != KIND_RAW && s->plain_size > 0)
            serialize_stream(s, rows_order, rows, have_order);
        if (seal_stream(s, n_gran, method, level) < 0)
            failed = 1;
    }
    if (released != NULL)
        PyEval_RestoreThread(released);
    if (failed) {
        PyErr_SetString(PyExc_RuntimeError, "seal_streams: the compression library failed");
        goto done;
    }
    out = PyList_New(n);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        stream *s = &ss[i];
        PyObject *t = Py_BuildValue("(y#y#ny#y#)", s->body != NULL ? (const char *)s->body : "",
                                    (Py_ssize_t)s->body_size, (const char *)s->body_hash, (Py_ssize_t)16,
                                    (Py_ssize_t)s->plain_size, (const char *)s->plain_hash, (Py_ssize_t)16,
                                    (const char *)s->marks, (Py_ssize_t)(16 * n_gran));
        if (t == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, t);
    }
done:
    if (have_order)
        PyBuffer_Release(&order);
    release_streams(ss, n);
    Py_DECREF(seq);
    return out;
}

static PyMethodDef methods[] = {
    {"seal_streams", seal_streams, METH_VARARGS,
     "A part's column streams serialized, cut into blocks, compressed and hashed, with their marks (see the "
     "module's source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_wholepart", "The streams of a part held whole in memory in one call.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__wholepart(void) { return PyModule_Create(&module_def); }
