/*
 * checksums.txt's version 3 body (what version 4 compresses), made from a part's checksums in one call:
 * per file, ~10 Python-level operations (name encoding, three VarUInts, appends) made it the largest
 * Python cost of closing a small part's files.
 *
 * Python API (module replicad.native._checksums):
 *   v3_body(files) -> bytes
 *     ``files``: a dict of file name (str) -> an object with ``file_size`` (int), ``file_hash`` (16 bytes),
 *     ``is_compressed`` (truth), ``uncompressed_size`` (int), ``uncompressed_hash`` (16 bytes) (a
 *     replicad.storage.checksums.Checksum), in the dict's order.  The body: VarUInt number of files, then
 *     per file the name as a String (VarUInt length, UTF-8 bytes), VarUInt size, the hash, a UInt8
 *     is_compressed and, if compressed, VarUInt uncompressed size and the uncompressed hash.  ValueError
 *     for a hash of another length or a negative size.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    char *buf;
    size_t len, cap;
} out_buf;

static int reserve(out_buf *o, size_t more) {
    if (o->len + more <= o->cap)
        return 0;
    size_t cap = o->cap ? o->cap : 1024;
    while (cap < o->len + more)
        cap *= 2;
    char *b = PyMem_Realloc(o->buf, cap);
    if (b == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    o->buf = b;
    o->cap = cap;
    return 0;
}

static int put_varuint(out_buf *o, uint64_t v) {
    if (reserve(o, 10) < 0)
        return -1;
    while (v >= 0x80) {
        o->buf[o->len++] = (char)(uint8_t)(v | 0x80);
        v >>= 7;
    }
    o->buf[o->len++] = (char)(uint8_t)v;
    return 0;
}

static int put_bytes(out_buf *o, const char *p, size_t n) {
    if (reserve(o, n) < 0)
        return -1;
    memcpy(o->buf + o->len, p, n);
    o->len += n;
    return 0;
}

static int put_size(out_buf *o, PyObject *entry, PyObject *attr) {
    PyObject *v = PyObject_GetAttr(entry, attr);
    if (v == NULL)
        return -1;
    unsigned long long n = PyLong_AsUnsignedLongLong(v);
    Py_DECREF(v);
    if (n == (unsigned long long)-1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "v3_body: a size is not a UInt64");
        }
        return -1;
    }
    return put_varuint(o, (uint64_t)n);
}

static int put_hash(out_buf *o, PyObject *entry, PyObject *attr) {
    PyObject *v = PyObject_GetAttr(entry, attr);
    if (v == NULL)
        return -1;
    Py_buffer b;
    if (PyObject_GetBuffer(v, &b, PyBUF_SIMPLE) < 0) {
        Py_DECREF(v);
        return -1;
    }
    int rc = -1;
    if (b.len != 16)
        PyErr_SetString(PyExc_ValueError, "v3_body: a hash is not 16 bytes");
    else
        rc = put_bytes(o, (const char *)b.buf, 16);
    PyBuffer_Release(&b);
    Py_DECREF(v);
    return rc;
}

static PyObject *s_file_size, *s_file_hash, *s_is_compressed, *s_uncompressed_size, *s_uncompressed_hash;

static PyObject *v3_body(PyObject *self, PyObject *files) {
    (void)self;
    if (!PyDict_Check(files)) {
        PyErr_SetString(PyExc_TypeError, "v3_body: files must be a dict");
        return NULL;
    }
    out_buf o = {NULL, 0, 0};
    PyObject *key, *entry, *result = NULL;
    Py_ssize_t pos = 0;
    if (put_varuint(&o, (uint64_t)PyDict_GET_SIZE(files)) < 0)
        goto done;
    while (PyDict_Next(files, &pos, &key, &entry)) {
        Py_ssize_t name_len;
        const char *name = PyUnicode_AsUTF8AndSize(key, &name_len);
        if (name == NULL || put_varuint(&o, (uint64_t)name_len) < 0 || put_bytes(&o, name, (size_t)name_len) < 0)
            goto done;
        if (put_size(&o, entry, s_file_size) < 0 || put_hash(&o, entry, s_file_hash) < 0)
            goto done;
        PyObject *flag = PyObject_GetAttr(entry, s_is_compressed);
        if (flag == NULL)
            goto done;
        int compressed = PyObject_IsTrue(flag);
        Py_DECREF(flag);
        if (compressed < 0 || reserve(&o, 1) < 0)
            goto done;
        o.buf[o.len++] = (char)(compressed ? 1 : 0);
        if (compressed && (put_size(&o, entry, s_uncompressed_size) < 0 ||
                           put_hash(&o, entry, s_uncompressed_hash) < 0))
            goto done;
    }
    result = PyBytes_FromStringAndSize(o.buf, (Py_ssize_t)o.len);
done:
    PyMem_Free(o.buf);
    return result;
}

static PyMethodDef methods[] = {
    {"v3_body", v3_body, METH_O, "checksums.txt's version 3 body of a dict of checksums."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_checksums", "checksums.txt bodies.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__checksums(void) {
    s_file_size = PyUnicode_InternFromString("file_size");
    s_file_hash = PyUnicode_InternFromString("file_hash");
    s_is_compressed = PyUnicode_InternFromString("is_compressed");
    s_uncompressed_size = PyUnicode_InternFromString("uncompressed_size");
    s_uncompressed_hash = PyUnicode_InternFromString("uncompressed_hash");
    if (!s_file_size || !s_file_hash || !s_is_compressed || !s_uncompressed_size || !s_uncompressed_hash)
        return NULL;
    return PyModule_Create(&module_def);
}
