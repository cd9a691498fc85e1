/*
 * The bit-stream loops of ClickHouse's DoubleDelta and Gorilla column codecs (see
 * replicad/storage/codecs.py for the formats; the block headers are parsed there).  Bit streams are
 * MSB first; values are unsigned little-endian integers of `width` bytes (1, 2, 4 or 8) and wrap.
 *
 * Python API (module replicad.native._bitcodecs):
 *   double_delta(bits, width, count, first, delta) -> bytes
 *       `count` values: `first`, `first + delta`, then one per coded change of delta in `bits`.
 *   gorilla(bits, width, count, first) -> bytes
 *       `count` values: `first`, then one per coded XOR in `bits`.
 * Both raise ValueError if the bit stream ends before `count` values or is malformed, and never read
 * outside `bits`.  The GIL is released while decoding.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    const uint8_t *p;
    Py_ssize_t nbits;
    Py_ssize_t pos;
} bitreader;

/* n <= 64 bits, MSB first; -1 past the end. */
static inline int read_bits(bitreader *r, int n, uint64_t *out) {
    uint64_t v = 0;
    if (n == 0) {
        *out = 0;
        return 0;
    }
    if (r->pos + n > r->nbits)
        return -1;
    int left = n;
    while (left > 0) {
        Py_ssize_t byte = r->pos >> 3;
        int off = (int)(r->pos & 7);
        int take = 8 - off;
        if (take > left)
            take = left;
        uint64_t bits = ((uint64_t)r->p[byte] >> (8 - off - take)) & ((1u << take) - 1u);
        v = (v << take) | bits;
        left -= take;
        r->pos += take;
    }
    *out = v;
    return 0;
}

static inline void store(uint8_t *dst, Py_ssize_t i, int width, uint64_t v) {
    for (int b = 0; b < width; b++)
        dst[i * width + b] = (uint8_t)(v >> (8 * b));
}

static int check_width(int width) {
    if (width != 1 && width != 2 && width != 4 && width != 8) {
        PyErr_Format(PyExc_ValueError, "bad value width %d", width);
        return -1;
    }
    return 0;
}

/* 0: ok, 1: stream ended early, 2: malformed */
static int run_double_delta(bitreader *r, uint8_t *dst, int width, Py_ssize_t count, uint64_t first,
                            uint64_t delta) {
    uint64_t mask = width == 8 ? ~(uint64_t)0 : (((uint64_t)1 << (8 * width)) - 1);
    uint64_t value = first & mask;
    store(dst, 0, width, value);
    if (count < 2)
        return 0;
    delta &= mask;
    value = (value + delta) & mask;
    store(dst, 1, width, value);
    static const int data_bits[6] = {0, 7, 9, 12, 32, 64};
    for (Py_ssize_t i = 2; i < count; i++) {
        int ones = 0;
        uint64_t bit;
        while (ones < 5) {
            if (read_bits(r, 1, &bit))
                return 1;
            if (!bit)
                break;
            ones++;
        }
        uint64_t dd = 0;
        if (ones > 0) {
            int nbits = data_bits[ones];
            uint64_t sign, mag;
            if (read_bits(r, 1, &sign) || read_bits(r, nbits - 1, &mag))
                return 1;
            dd = mag + 1;
            if (sign)
                dd = (uint64_t)0 - dd;
        }
        delta = (delta + dd) & mask;
        value = (value + delta) & mask;
        store(dst, i, width, value);
    }
    return 0;
}

static int run_gorilla(bitreader *r, uint8_t *dst, int width, Py_ssize_t count, uint64_t first) {
    static const int length_bits_of[9] = {0, 4, 5, 0, 6, 0, 0, 0, 7};
    int bit_size = 8 * width;
    int length_bits = length_bits_of[width];
    uint64_t value = first;
    int lead = 0, data = 0, trail = 0;
    store(dst, 0, width, value);
    for (Py_ssize_t i = 1; i < count; i++) {
        uint64_t bit;
        if (read_bits(r, 1, &bit))
            return 1;
        if (bit) {
            if (read_bits(r, 1, &bit))
                return 1;
            if (bit) {
                uint64_t l, d;
                if (read_bits(r, length_bits - 1, &l) || read_bits(r, length_bits, &d))
                    return 1;
                lead = (int)l;
                data = (int)d;
                trail = bit_size - lead - data;
                if (trail < 0)
                    return 2;
            }
            if (lead == 0 && data == 0 && trail == 0)
                return 2;
            uint64_t x;
            if (read_bits(r, data, &x))
                return 1;
            value ^= trail >= 64 ? 0 : (x << trail);
        }
        store(dst, i, width, value);
    }
    return 0;
}

static PyObject *decode_common(PyObject *args, int gorilla) {
    Py_buffer bits;
    int width;
    Py_ssize_t count;
    unsigned long long first, delta = 0;
    if (gorilla) {
        if (!PyArg_ParseTuple(args, "y*inK", &bits, &width, &count, &first))
            return NULL;
    } else {
        if (!PyArg_ParseTuple(args, "y*inKK", &bits, &width, &count, &first, &delta))
            return NULL;
    }
    if (check_width(width) || count < 1 || count > PY_SSIZE_T_MAX / 8) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "bad value count");
        PyBuffer_Release(&bits);
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, count * width);
    if (out == NULL) {
        PyBuffer_Release(&bits);
        return NULL;
    }
    bitreader r = {(const uint8_t *)bits.buf, bits.len * 8, 0};
    uint8_t *dst = (uint8_t *)PyBytes_AS_STRING(out);
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = gorilla ? run_gorilla(&r, dst, width, count, first)
                     : run_double_delta(&r, dst, width, count, first, delta);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&bits);
    if (status) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_ValueError, status == 1 ? "bit stream ends early" : "malformed bit stream");
        return NULL;
    }
    return out;
}

static PyObject *py_double_delta(PyObject *self, PyObject *args) { return decode_common(args, 0); }

static PyObject *py_gorilla(PyObject *self, PyObject *args) { return decode_common(args, 1); }

static PyMethodDef methods[] = {
    {"double_delta", py_double_delta, METH_VARARGS, "Decode the bit stream of a DoubleDelta block."},
    {"gorilla", py_gorilla, METH_VARARGS, "Decode the bit stream of a Gorilla block."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_bitcodecs", NULL, -1, methods};

PyMODINIT_FUNC PyInit__bitcodecs(void) { return PyModule_Create(&module); }
