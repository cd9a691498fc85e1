/*
 * ClickHouse's SipHash-2-4 with key (0, 0), streaming, as used for partition IDs, block IDs, the
 * minimalistic part checksums and the columns hash.
 *
 * Compression and 64-bit finalisation follow the SipHash reference: the last word carries the
 * remaining (< 8) bytes little-endian with the low byte of the total length in its top byte,
 * then v2 ^= 0xff and four rounds.  ClickHouse's 128-bit value is not the reference SipHash-128:
 * after that same finalisation it takes lo = v0 ^ v1, hi = v2 ^ v3 (get64 is v0 ^ v1 ^ v2 ^ v3).
 * 16-byte digests are lo little-endian then hi little-endian.
 *
 * Python API (module replicad.native._siphash):
 *   sip128(buf) -> bytes(16)     sip64(buf) -> int
 *   Hasher(): .update(buf), .update_u64(int), .update_string(buf),
 *             .get128() -> (lo, hi), .digest128() -> bytes(16), .get64() -> int, .copy()
 * Finalising does not change the state, so a Hasher may be fed further after a digest.
 * The GIL is released while hashing large buffers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define GIL_THRESHOLD 65536

typedef struct {
    uint64_t v0, v1, v2, v3;
    uint64_t cnt;     /* bytes fed so far */
    uint8_t tail[8];  /* bytes not yet forming a whole word */
    unsigned tail_len;
} sip_state;

static inline uint64_t rotl(uint64_t x, unsigned b) {
    return (x << b) | (x >> (64 - b));
}

static inline uint64_t load_le64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline void store_le64(uint8_t *p, uint64_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    memcpy(p, &v, 8);
}

#define SIP_ROUND(v0, v1, v2, v3) \
    do {                          \
        v0 += v1;                 \
        v1 = rotl(v1, 13) ^ v0;   \
        v0 = rotl(v0, 32);        \
        v2 += v3;                 \
        v3 = rotl(v3, 16) ^ v2;   \
        v0 += v3;                 \
        v3 = rotl(v3, 21) ^ v0;   \
        v2 += v1;                 \
        v1 = rotl(v1, 17) ^ v2;   \
        v2 = rotl(v2, 32);        \
    } while (0)

static void sip_init(sip_state *s) {
    s->v0 = 0x736f6d6570736575ULL;
    s->v1 = 0x646f72616e646f6dULL;
    s->v2 = 0x6c7967656e657261ULL;
    s->v3 = 0x7465646279746573ULL;
    s->cnt = 0;
    s->tail_len = 0;
}

/* absorb whole little-endian words; returns the number of bytes used (a multiple of 8) */
static size_t sip_words(sip_state *s, const uint8_t *p, size_t n) {
    uint64_t v0 = s->v0, v1 = s->v1, v2 = s->v2, v3 = s->v3;
    size_t used = n & ~(size_t)7;
    for (size_t i = 0; i < used; i += 8) {
        uint64_t m = load_le64(p + i);
        v3 ^= m;
        SIP_ROUND(v0, v1, v2, v3);
        SIP_ROUND(v0, v1, v2, v3);
        v0 ^= m;
    }
    s->v0 = v0;
    s->v1 = v1;
    s->v2 = v2;
    s->v3 = v3;
    return used;
}

static void sip_feed(sip_state *s, const uint8_t *p, size_t n) {
    s->cnt += n;
    if (s->tail_len) {
        size_t take = 8 - s->tail_len;
        if (take > n)
            take = n;
        memcpy(s->tail + s->tail_len, p, take);
        s->tail_len += (unsigned)take;
        p += take;
        n -= take;
        if (s->tail_len < 8)
            return;
        sip_words(s, s->tail, 8);
        s->tail_len = 0;
    }
    size_t used = sip_words(s, p, n);
    if (used < n) {
        memcpy(s->tail, p + used, n - used);
        s->tail_len = (unsigned)(n - used);
    }
}

/* finalise a copy of the state into out[4] = (v0, v1, v2, v3) */
static void sip_final(const sip_state *s, uint64_t out[4]) {
    uint64_t v0 = s->v0, v1 = s->v1, v2 = s->v2, v3 = s->v3;
    uint64_t last = (s->cnt & 0xffULL) << 56;
    for (unsigned i = 0; i < s->tail_len; i++)
        last |= (uint64_t)s->tail[i] << (8 * i);
    v3 ^= last;
    SIP_ROUND(v0, v1, v2, v3);
    SIP_ROUND(v0, v1, v2, v3);
    v0 ^= last;
    v2 ^= 0xff;
    SIP_ROUND(v0, v1, v2, v3);
    SIP_ROUND(v0, v1, v2, v3);
    SIP_ROUND(v0, v1, v2, v3);
    SIP_ROUND(v0, v1, v2, v3);
    out[0] = v0;
    out[1] = v1;
    out[2] = v2;
    out[3] = v3;
}

/* feed a buffer into a copy of *s, releasing the GIL when it is large, then store the result back:
 * a hasher shared between threads can then give a wrong hash but never corrupt memory */
static void sip_feed_buffer(sip_state *s, const Py_buffer *b) {
    if (b->len >= GIL_THRESHOLD) {
        sip_state local = *s;
        Py_BEGIN_ALLOW_THREADS
        sip_feed(&local, (const uint8_t *)b->buf, (size_t)b->len);
        Py_END_ALLOW_THREADS
        *s = local;
    } else {
        sip_feed(s, (const uint8_t *)b->buf, (size_t)b->len);
    }
}

static PyObject *digest_bytes(const uint64_t v[4]) {
    uint8_t out[16];
    store_le64(out, v[0] ^ v[1]);
    store_le64(out + 8, v[2] ^ v[3]);
    return PyBytes_FromStringAndSize((const char *)out, 16);
}

static int one_shot(PyObject *arg, uint64_t v[4]) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return -1;
    sip_state s;
    sip_init(&s);
    sip_feed_buffer(&s, &b);
    PyBuffer_Release(&b);
    sip_final(&s, v);
    return 0;
}

static PyObject *py_sip128(PyObject *self, PyObject *arg) {
    uint64_t v[4];
    if (one_shot(arg, v) < 0)
        return NULL;
    return digest_bytes(v);
}

static PyObject *py_sip64(PyObject *self, PyObject *arg) {
    uint64_t v[4];
    if (one_shot(arg, v) < 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(v[0] ^ v[1] ^ v[2] ^ v[3]);
}

/* ------------------------------------------------------------------ streaming hasher */

typedef struct {
    PyObject_HEAD
    sip_state s;
} HasherObject;

static int Hasher_init(HasherObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "", kwlist))
        return -1;
    sip_init(&self->s);
    return 0;
}

static PyObject *Hasher_update(HasherObject *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    sip_feed_buffer(&self->s, &b);
    PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

/* the 8 little-endian bytes of an integer taken modulo 2**64 */
static int feed_u64(sip_state *s, PyObject *arg) {
    if (!PyIndex_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "an integer is required, not %.100s", Py_TYPE(arg)->tp_name);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLongMask(arg);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    uint8_t word[8];
    store_le64(word, (uint64_t)v);
    sip_feed(s, word, 8);
    return 0;
}

static PyObject *Hasher_update_u64(HasherObject *self, PyObject *arg) {
    if (feed_u64(&self->s, arg) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Hasher_update_string(HasherObject *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    uint8_t word[8];
    store_le64(word, (uint64_t)b.len);
    sip_feed(&self->s, word, 8);
    sip_feed_buffer(&self->s, &b);
    PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

static PyObject *Hasher_get128(HasherObject *self, PyObject *unused) {
    uint64_t v[4];
    sip_final(&self->s, v);
    PyObject *lo = PyLong_FromUnsignedLongLong(v[0] ^ v[1]);
    if (lo == NULL)
        return NULL;
    PyObject *hi = PyLong_FromUnsignedLongLong(v[2] ^ v[3]);
    if (hi == NULL) {
        Py_DECREF(lo);
        return NULL;
    }
    PyObject *t = PyTuple_Pack(2, lo, hi);
    Py_DECREF(lo);
    Py_DECREF(hi);
    return t;
}

static PyObject *Hasher_digest128(HasherObject *self, PyObject *unused) {
    uint64_t v[4];
    sip_final(&self->s, v);
    return digest_bytes(v);
}

static PyObject *Hasher_get64(HasherObject *self, PyObject *unused) {
    uint64_t v[4];
    sip_final(&self->s, v);
    return PyLong_FromUnsignedLongLong(v[0] ^ v[1] ^ v[2] ^ v[3]);
}

static PyObject *Hasher_copy(HasherObject *self, PyObject *unused) {
    HasherObject *o = PyObject_New(HasherObject, Py_TYPE(self));
    if (o == NULL)
        return NULL;
    o->s = self->s;
    return (PyObject *)o;
}

static PyObject *Hasher_get_size(HasherObject *self, void *closure) {
    return PyLong_FromUnsignedLongLong(self->s.cnt);
}

static PyMethodDef Hasher_methods[] = {
    {"update", (PyCFunction)Hasher_update, METH_O, "Feed bytes."},
    {"update_u64", (PyCFunction)Hasher_update_u64, METH_O,
     "Feed the 8 little-endian bytes of an integer modulo 2**64."},
    {"update_string", (PyCFunction)Hasher_update_string, METH_O,
     "Feed the length (8 bytes LE) and then the bytes of a buffer."},
    {"get128", (PyCFunction)Hasher_get128, METH_NOARGS, "(lo, hi) = (v0 ^ v1, v2 ^ v3) after finalisation."},
    {"digest128", (PyCFunction)Hasher_digest128, METH_NOARGS, "16 bytes: lo LE then hi LE."},
    {"get64", (PyCFunction)Hasher_get64, METH_NOARGS, "64-bit SipHash-2-4 of everything fed so far."},
    {"copy", (PyCFunction)Hasher_copy, METH_NOARGS, "Independent copy of the hasher."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Hasher_getset[] = {
    {"size", (getter)Hasher_get_size, NULL, "Number of bytes fed so far.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject HasherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "replicad.native._siphash.Hasher",
    .tp_basicsize = sizeof(HasherObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Streaming ClickHouse SipHash-2-4 (key 0, 0) with its 64- and 128-bit outputs.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Hasher_init,
    .tp_methods = Hasher_methods,
    .tp_getset = Hasher_getset,
};

static PyMethodDef module_methods[] = {
    {"sip128", py_sip128, METH_O, "ClickHouse SipHash 128-bit value of a buffer -> 16 bytes (lo LE, hi LE)."},
    {"sip64", py_sip64, METH_O, "SipHash-2-4 (key 0, 0) 64-bit value of a buffer."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_siphash", "ClickHouse's SipHash-2-4 (64- and 128-bit outputs).", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__siphash(void) {
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
    return m;
}
