/*
 * A small part's streams read whole in one call: each stream's marks file and its .bin, the .bin's one
 * compressed block verified (CityHash128 of the block) and decompressed.  A merge of small inserts' parts
 * opened, stat-ed and read ~13 files per source part through a dozen Python-level calls each; here the GIL
 * is let go once for all of them.
 *
 * Python API (module replicad.native._partread):
 *   read_whole_streams(directory, streams, max_bytes) -> list
 *     ``streams``: a sequence of (marks file name, data file name) in ``directory``.  For each, in order:
 *     (marks bytes, decompressed data bytes, data file size) when the marks file can be read and the data
 *     file is empty or one intact block (checksum, sizes, method none / LZ4 / ZSTD of the system
 *     libraries) decompressing to at most ``max_bytes``; else None: a missing or unreadable file, a name
 *     that is not a file of the directory (a '/', a symbolic link), a data file past ``max_bytes``, more
 *     than one block, or any fault of the block (the caller reads that stream the general way, which names
 *     the fault).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cityhash102_core.h"
#include "system_codecs.h"

#define MARKS_MAX (1 << 20)

typedef struct {
    PyObject *marks_name, *data_name; /* bytes (file-system encoding) */
    uint8_t *marks, *raw, *data;
    size_t marks_len, raw_len, data_len;
    int ok;
} stream;

/* (no Python) the whole file dir/name into a malloc'd buffer of at most limit bytes; -1 when it cannot */
static int read_file(int dir_fd, const char *name, size_t limit, uint8_t **out, size_t *len) {
    if (strchr(name, '/') != NULL || name[0] == 0 || strcmp(name, "..") == 0)
        return -1; /* a name in the directory, nothing else */
    int fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) < 0 || st.st_size < 0 || (size_t)st.st_size > limit) {
        close(fd);
        return -1;
    }
    size_t size = (size_t)st.st_size, got = 0;
    uint8_t *buf = malloc(size ? size : 1);
    if (buf == NULL) {
        close(fd);
        return -1;
    }
    while (got < size) {
        ssize_t n = read(fd, buf + got, size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    if (got != size) {
        free(buf);
        return -1;
    }
    *out = buf;
    *len = size;
    return 0;
}

static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int method_loaded(int method) {
    return method == METHOD_NONE || (method == METHOD_LZ4 && lz4.loaded) || (method == METHOD_ZSTD && zstd.loaded);
}

/* (no Python) the stream's one block verified and decompressed into s->data; -1 when it is not that */
static int decode_one_block(stream *s, size_t max_bytes) {
    if (s->raw_len == 0) {
        s->data = malloc(1);
        s->data_len = 0;
        return s->data == NULL ? -1 : 0;
    }
    if (s->raw_len < OVERHEAD)
        return -1;
    const uint8_t *h = s->raw + CHECKSUM_SIZE;
    int method = h[0];
    uint32_t csize = get_u32(h + 1), dsize = get_u32(h + 5);
    if (csize < HEADER_SIZE || (size_t)CHECKSUM_SIZE + csize != s->raw_len || dsize > max_bytes ||
        !method_loaded(method))
        return -1;
    u128 sum = ch128(h, csize);
    for (int i = 0; i < 8; i++)
        if (s->raw[i] != (uint8_t)(sum.lo >> (8 * i)) || s->raw[8 + i] != (uint8_t)(sum.hi >> (8 * i)))
            return -1;
    s->data = malloc(dsize ? dsize : 1);
    if (s->data == NULL)
        return -1;
    s->data_len = dsize;
    return decompress_payload(method, h + HEADER_SIZE, csize - HEADER_SIZE, s->data, dsize);
}

static void release(stream *ss, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_XDECREF(ss[i].marks_name);
        Py_XDECREF(ss[i].data_name);
        free(ss[i].marks);
        free(ss[i].raw);
        free(ss[i].data);
    }
    PyMem_Free(ss);
}

static PyObject *read_whole_streams(PyObject *self, PyObject *args) {
    PyObject *dir = NULL, *streams, *seq, *out = NULL;
    Py_ssize_t max_bytes;
    (void)self;
    if (!PyArg_ParseTuple(args, "O&On", PyUnicode_FSConverter, &dir, &streams, &max_bytes))
        return NULL;
    seq = PySequence_Fast(streams, "read_whole_streams: streams must be a sequence");
    if (seq == NULL) {
        Py_DECREF(dir);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    stream *ss = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(stream));
    if (ss == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_SetString(PyExc_TypeError, "read_whole_streams: each stream is (marks name, data name)");
            goto done;
        }
        if (!PyUnicode_FSConverter(PyTuple_GET_ITEM(item, 0), &ss[i].marks_name) ||
            !PyUnicode_FSConverter(PyTuple_GET_ITEM(item, 1), &ss[i].data_name))
            goto done;
    }
    /* the libraries a block may need; one that cannot be loaded leaves its blocks to the general path */
    if (load_method(METHOD_LZ4) < 0)
        PyErr_Clear();
    if (load_method(METHOD_ZSTD) < 0)
        PyErr_Clear();
    size_t limit = max_bytes > 0 ? (size_t)max_bytes : 0;
    const char *dir_path = PyBytes_AS_STRING(dir);
    Py_BEGIN_ALLOW_THREADS
    int dir_fd = open(dir_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    for (Py_ssize_t i = 0; dir_fd >= 0 && i < n; i++) {
        stream *s = &ss[i];
        s->ok = read_file(dir_fd, PyBytes_AS_STRING(s->marks_name), MARKS_MAX, &s->marks, &s->marks_len) == 0 &&
                read_file(dir_fd, PyBytes_AS_STRING(s->data_name), limit, &s->raw, &s->raw_len) == 0 &&
                decode_one_block(s, limit) == 0;
    }
    if (dir_fd >= 0)
        close(dir_fd);
    Py_END_ALLOW_THREADS
    out = PyList_New(n);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        stream *s = &ss[i];
        PyObject *t = s->ok ? Py_BuildValue("(y#y#n)", (const char *)s->marks, (Py_ssize_t)s->marks_len,
                                            (const char *)s->data, (Py_ssize_t)s->data_len,
                                            (Py_ssize_t)s->raw_len)
                            : Py_NewRef(Py_None);
        if (t == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, t);
    }
done:
    if (ss != NULL)
        release(ss, n);
    Py_DECREF(seq);
    Py_DECREF(dir);
    return out;
}

static PyMethodDef methods[] = {
    {"read_whole_streams", read_whole_streams, METH_VARARGS,
     "A small part's streams read whole: marks and decompressed data (see the module's source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_partread", "A small part's streams read whole in one call.", -1, methods, NULL,
    NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__partread(void) { return PyModule_Create(&module_def); }
