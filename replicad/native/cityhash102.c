/*
 * CityHash v1.0.2 (the 128-bit variants only), as pinned by ClickHouse, plus the
 * "hashing buffer" file hash ClickHouse writes into checksums.txt and sends after
 * every file in DataPartsExchange: the input is cut into 2048-byte chunks and the
 * 128-bit state (starting at zero) is replaced by CityHash128WithSeed(chunk, state)
 * for each chunk (the last one may be shorter); empty input hashes to zero.
 *
 * A 128-bit value is a pair (lo, hi); bytes on disk/wire are lo LE then hi LE.
 *
 * Python API (module replicad.native._cityhash102):
 *   cityhash128(buf) -> bytes(16)
 *   cityhash128_with_seed(buf, lo, hi) -> (lo, hi)
 *   file_hash(buf) -> bytes(16)
 *   Hasher(): .update(buf), .digest() -> bytes(16), .size (int), .copy()
 * The GIL is released while hashing large buffers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define GIL_THRESHOLD 65536

/* Run STATEMENT without the GIL when LEN bytes are enough for releasing it to pay off. */
#define WITHOUT_GIL_IF_LARGE(LEN, STATEMENT) \
    do {                                     \
        if ((LEN) >= GIL_THRESHOLD) {        \
            Py_BEGIN_ALLOW_THREADS           \
            STATEMENT;                       \
            Py_END_ALLOW_THREADS             \
        } else {                             \
            STATEMENT;                       \
        }                                    \
    } while (0)

#include "cityhash102_core.h"

static PyObject *u128_bytes(u128 v) {
    uint8_t out[16];
    for (int i = 0; i < 8; i++) {
        out[i] = (uint8_t)(v.lo >> (8 * i));
        out[8 + i] = (uint8_t)(v.hi >> (8 * i));
    }
    return PyBytes_FromStringAndSize((const char *)out, 16);
}

/* ---------------------------------------------------------------- functions */

static PyObject *py_cityhash128(PyObject *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    u128 r;
    WITHOUT_GIL_IF_LARGE(b.len, r = ch128((const uint8_t *)b.buf, (size_t)b.len));
    PyBuffer_Release(&b);
    return u128_bytes(r);
}

static PyObject *py_cityhash128_with_seed(PyObject *self, PyObject *args) {
    Py_buffer b;
    unsigned long long lo, hi;
    if (!PyArg_ParseTuple(args, "y*KK", &b, &lo, &hi))
        return NULL;
    u128 seed = {(uint64_t)lo, (uint64_t)hi}, r;
    WITHOUT_GIL_IF_LARGE(b.len, r = ch128_seed((const uint8_t *)b.buf, (size_t)b.len, seed));
    PyBuffer_Release(&b);
    return Py_BuildValue("(KK)", (unsigned long long)r.lo, (unsigned long long)r.hi);
}


static PyObject *py_file_hash(PyObject *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    u128 r;
    WITHOUT_GIL_IF_LARGE(b.len, r = whole_file_hash((const uint8_t *)b.buf, (size_t)b.len));
    PyBuffer_Release(&b);
    return u128_bytes(r);
}

/* ------------------------------------------------------------ Hasher type */

typedef struct {
    PyObject_HEAD
    u128 state;
    unsigned long long size;
    size_t pos;
    uint8_t buf[CH_CHUNK];
} HasherObject;

static int Hasher_init(HasherObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "", kwlist))
        return -1;
    self->state.lo = 0;
    self->state.hi = 0;
    self->size = 0;
    self->pos = 0;
    return 0;
}

static void hasher_feed(HasherObject *self, const uint8_t *p, size_t n) {
    self->size += n;
    if (self->pos) {
        size_t take = CH_CHUNK - self->pos;
        if (take > n)
            take = n;
        memcpy(self->buf + self->pos, p, take);
        self->pos += take;
        p += take;
        n -= take;
        if (self->pos < CH_CHUNK)
            return;
        self->state = ch128_seed(self->buf, CH_CHUNK, self->state);
        self->pos = 0;
    }
    size_t used = chain_chunks(&self->state, p, n);
    if (used < n) {
        memcpy(self->buf, p + used, n - used);
        self->pos = n - used;
    }
}

static PyObject *Hasher_update(HasherObject *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    /* the object is not safe to share between threads during update anyway */
    WITHOUT_GIL_IF_LARGE(b.len, hasher_feed(self, (const uint8_t *)b.buf, (size_t)b.len));
    PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

static PyObject *Hasher_digest(HasherObject *self, PyObject *unused) {
    u128 r = self->state;
    if (self->pos)
        r = ch128_seed(self->buf, self->pos, r);
    return u128_bytes(r);
}

static PyObject *Hasher_copy(HasherObject *self, PyObject *unused) {
    HasherObject *o = PyObject_New(HasherObject, Py_TYPE(self));
    if (o == NULL)
        return NULL;
    o->state = self->state;
    o->size = self->size;
    o->pos = self->pos;
    memcpy(o->buf, self->buf, self->pos);
    return (PyObject *)o;
}

static PyObject *Hasher_get_size(HasherObject *self, void *closure) {
    return PyLong_FromUnsignedLongLong(self->size);
}

static PyMethodDef Hasher_methods[] = {
    {"update", (PyCFunction)Hasher_update, METH_O, "Feed bytes."},
    {"digest", (PyCFunction)Hasher_digest, METH_NOARGS, "16-byte hash of everything fed so far."},
    {"copy", (PyCFunction)Hasher_copy, METH_NOARGS, "Independent copy of the hasher."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Hasher_getset[] = {
    {"size", (getter)Hasher_get_size, NULL, "Number of bytes fed so far.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject HasherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "replicad.native._cityhash102.Hasher",
    .tp_basicsize = sizeof(HasherObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Streaming ClickHouse hashing-buffer hash (chained CityHash128WithSeed over 2048-byte chunks).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Hasher_init,
    .tp_methods = Hasher_methods,
    .tp_getset = Hasher_getset,
};

static PyMethodDef module_methods[] = {
    {"cityhash128", py_cityhash128, METH_O, "CityHash128 v1.0.2 -> 16 bytes (low word first)."},
    {"cityhash128_with_seed", py_cityhash128_with_seed, METH_VARARGS,
     "CityHash128WithSeed v1.0.2 (data, seed_lo, seed_hi) -> (lo, hi)."},
    {"file_hash", py_file_hash, METH_O, "ClickHouse hashing-buffer hash of a whole buffer -> 16 bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_cityhash102", "CityHash v1.0.2 128-bit hashes for ClickHouse interop.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__cityhash102(void) {
    if (PyType_Ready(&HasherType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    Py_INCREF(&HasherType);
    if (PyModule_AddObject(m, "Hasher", (PyObject *)&HasherType) < 0) {
        Py_DECREF(&HasherType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "CHUNK_SIZE", CH_CHUNK) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
