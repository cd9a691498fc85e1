/*
 * A directory's small files made in one call, with the GIL let go once for all of them.
 *
 * A small insert's part is ~18 files of a few bytes to a few KiB.  Made from Python, each file is three
 * system calls (open, write, close), and each one lets go of the GIL: another thread (the event loop
 * handling the block-number lock's answer, kazoo's connection thread) takes it, and the writing thread
 * waits to get it back, up to a switch interval, ~50 times per part.  Here the GIL is let go once.
 *
 * Python API (module replicad.native._files):
 *   write_files(directory, [(name, data), ...], fsync, make_dir=False, prepared=False) -> None
 *     With ``make_dir`` the directory is made first (mkdir, mode 0o777 less the umask, as Path.mkdir; its
 *     failure, FileExistsError included, raises OSError naming the directory).  Each file is created (or truncated) in ``directory`` as os.open(path, O_WRONLY | O_CREAT | O_TRUNC |
 *     O_CLOEXEC, 0o666) makes it (the umask decides the mode), written whole, fsynced when ``fsync``, and
 *     closed, in the order given; with ``fsync`` the directory is fsynced last.  The first failure raises
 *     OSError (its errno, the file's path) and stops there; files already made stay (the caller removes
 *     the directory).  ``data``: any contiguous buffer.
 *     With ``prepared`` the files are expected to exist already, empty (a directory made ahead of the write,
 *     replicad/storage/prepared_dirs.py): each is opened without O_TRUNC (truncating even an empty file
 *     costs ext4 a journal update: ~1 ms more per part, measured), and cut to what was written should it
 *     hold more (fstat after the write).  A file that is missing is created as without ``prepared``.
 *   read_files(directory, [name, ...], optional=0, max_bytes=...) -> [bytes | None, ...]
 *     Each file of ``directory`` read whole, in the order given, the GIL let go once for all of them (a small
 *     part's ~20 files sent to a replica: four system calls each, every one a chance for another thread to
 *     take the GIL).  A file is read with one request for one byte more than fstat said: a read that comes
 *     back short or long means the file changed size meanwhile, and raises OSError (EIO) naming it.  The
 *     last ``optional`` names may be missing: None for those; any other failure (a missing file among the
 *     others included) raises OSError with its errno and path and reads no further.  More than
 *     ``max_bytes`` in all (default 64 MiB): OSError (EFBIG) naming the file that passed it.
 */
#include <sys/types.h>
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    PyObject *name; /* bytes (file-system encoding) */
    Py_buffer data;
    int have_data;
} entry;

static void release(entry *entries, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_XDECREF(entries[i].name);
        if (entries[i].have_data)
            PyBuffer_Release(&entries[i].data);
    }
    PyMem_Free(entries);
}

/* OSError ``err`` naming ``dir_path``, or its file ``name`` (bytes) when given */
static void set_os_error(int err, const char *dir_path, PyObject *name) {
    PyObject *path = PyUnicode_DecodeFSDefault(dir_path);
    if (path != NULL && name != NULL) {
        PyObject *text = PyUnicode_DecodeFSDefault(PyBytes_AS_STRING(name));
        PyObject *full = text != NULL ? PyUnicode_FromFormat("%U/%U", path, text) : NULL;
        Py_XDECREF(text);
        Py_DECREF(path);
        path = full;
    }
    errno = err;
    PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path);
    Py_XDECREF(path);
}

static int write_whole(int fd, const char *p, Py_ssize_t left) {
    while (left > 0) {
        ssize_t n = write(fd, p, (size_t)left);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        left -= n;
    }
    return 0;
}

static PyObject *write_files(PyObject *self, PyObject *args) {
    PyObject *dir = NULL, *files, *seq;
    int do_fsync, make_dir = 0, prepared = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "O&Op|pp", PyUnicode_FSConverter, &dir, &files, &do_fsync, &make_dir, &prepared))
        return NULL;
    seq = PySequence_Fast(files, "write_files: files must be a sequence of (name, data)");
    if (seq == NULL) {
        Py_DECREF(dir);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    entry *entries = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(entry));
    if (entries == NULL) {
        Py_DECREF(seq);
        Py_DECREF(dir);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i), *name_obj, *data_obj;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_SetString(PyExc_TypeError, "write_files: each file is a (name, data) tuple");
            goto fail;
        }
        name_obj = PyTuple_GET_ITEM(item, 0);
        data_obj = PyTuple_GET_ITEM(item, 1);
        if (!PyUnicode_FSConverter(name_obj, &entries[i].name))
            goto fail;
        if (memchr(PyBytes_AS_STRING(entries[i].name), '/', (size_t)PyBytes_GET_SIZE(entries[i].name))) {
            PyErr_SetString(PyExc_ValueError, "write_files: a file name cannot hold '/'");
            goto fail;
        }
        if (PyObject_GetBuffer(data_obj, &entries[i].data, PyBUF_SIMPLE) < 0)
            goto fail;
        entries[i].have_data = 1;
    }

    const char *dir_path = PyBytes_AS_STRING(dir);
    int err = 0;
    Py_ssize_t failed = -1; /* the file that failed; n: the directory */
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (prepared ? 0 : O_TRUNC);
    Py_BEGIN_ALLOW_THREADS
    int dfd = make_dir && mkdir(dir_path, 0777) < 0 ? -1 : open(dir_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        err = errno;
        failed = n;
    } else {
        for (Py_ssize_t i = 0; i < n; i++) {
            int fd = openat(dfd, PyBytes_AS_STRING(entries[i].name), flags, 0666);
            if (fd < 0) {
                err = errno;
                failed = i;
                break;
            }
            struct stat st;
            if (write_whole(fd, entries[i].data.buf, entries[i].data.len) < 0
                || (prepared && (fstat(fd, &st) < 0
                                 || (st.st_size > (off_t)entries[i].data.len
                                     && ftruncate(fd, (off_t)entries[i].data.len) < 0)))
                || (do_fsync && fsync(fd) < 0)) {
                err = errno;
                failed = i;
                close(fd);
                break;
            }
            if (close(fd) < 0 && errno != EINTR) {
                err = errno;
                failed = i;
                break;
            }
        }
        if (failed < 0 && do_fsync && fsync(dfd) < 0) {
            err = errno;
            failed = n;
        }
        close(dfd);
    }
    Py_END_ALLOW_THREADS

    if (failed >= 0) {
        set_os_error(err, dir_path, failed < n ? entries[failed].name : NULL);
        goto fail;
    }
    release(entries, n);
    Py_DECREF(seq);
    Py_DECREF(dir);
    Py_RETURN_NONE;

fail:
    release(entries, n);
    Py_DECREF(seq);
    Py_DECREF(dir);
    return NULL;
}

typedef struct {
    PyObject *name; /* bytes (file-system encoding) */
    char *data;
    Py_ssize_t size;
    int missing;
} read_entry;

static void release_read(read_entry *entries, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_XDECREF(entries[i].name);
        free(entries[i].data);
    }
    PyMem_Free(entries);
}

/* (no Python) read the file ``name`` of ``dfd`` whole into e->data; 0, or an errno */
static int read_whole(int dfd, read_entry *e, int optional, Py_ssize_t *budget) {
    int fd = openat(dfd, PyBytes_AS_STRING(e->name), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (optional && errno == ENOENT) {
            e->missing = 1;
            return 0;
        }
        return errno;
    }
    struct stat st;
    int err = 0;
    if (fstat(fd, &st) < 0) {
        err = errno;
    } else if (!S_ISREG(st.st_mode)) {
        err = EISDIR;
    } else if ((Py_ssize_t)st.st_size > *budget) {
        err = EFBIG;
    } else {
        size_t want = (size_t)st.st_size + 1;
        e->data = malloc(want);
        if (e->data == NULL) {
            err = ENOMEM;
        } else {
            size_t got = 0;
            for (;;) {
                ssize_t r = read(fd, e->data + got, want - got);
                if (r < 0 && errno == EINTR)
                    continue;
                if (r < 0) {
                    err = errno;
                    break;
                }
                got += (size_t)r;
                if (r == 0 || got == want)
                    break;
            }
            if (!err && got != (size_t)st.st_size)
                err = EIO; /* grew or shrank since the fstat */
            e->size = (Py_ssize_t)got;
            *budget -= e->size;
        }
    }
    close(fd);
    return err;
}

static PyObject *read_files(PyObject *self, PyObject *args) {
    PyObject *dir = NULL, *names, *seq, *out = NULL;
    Py_ssize_t optional = 0, max_bytes = (Py_ssize_t)64 << 20;
    (void)self;
    if (!PyArg_ParseTuple(args, "O&O|nn", PyUnicode_FSConverter, &dir, &names, &optional, &max_bytes))
        return NULL;
    seq = PySequence_Fast(names, "read_files: names must be a sequence of str");
    if (seq == NULL) {
        Py_DECREF(dir);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    read_entry *entries = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(read_entry));
    if (entries == NULL) {
        Py_DECREF(seq);
        Py_DECREF(dir);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(seq, i), &entries[i].name))
            goto done;
        const char *name = PyBytes_AS_STRING(entries[i].name);
        if (memchr(name, '/', (size_t)PyBytes_GET_SIZE(entries[i].name)) || name[0] == '\0'
            || strcmp(name, ".") == 0 || strcmp(name, "..") == 0) {
            PyErr_SetString(PyExc_ValueError, "read_files: a file name cannot hold '/' nor be '', '.' or '..'");
            goto done;
        }
    }
    const char *dir_path = PyBytes_AS_STRING(dir);
    int err = 0;
    Py_ssize_t failed = -1, budget = max_bytes; /* the file that failed; n: the directory */
    Py_BEGIN_ALLOW_THREADS
    int dfd = open(dir_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        err = errno;
        failed = n;
    } else {
        for (Py_ssize_t i = 0; i < n; i++) {
            err = read_whole(dfd, &entries[i], i >= n - optional, &budget);
            if (err) {
                failed = i;
                break;
            }
        }
        close(dfd);
    }
    Py_END_ALLOW_THREADS
    if (failed >= 0) {
        set_os_error(err, dir_path, failed < n ? entries[failed].name : NULL);
        goto done;
    }
    out = PyList_New(n);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item;
        if (entries[i].missing) {
            item = Py_None;
            Py_INCREF(item);
        } else {
            item = PyBytes_FromStringAndSize(entries[i].data != NULL ? entries[i].data : "", entries[i].size);
            if (item == NULL) {
                Py_CLEAR(out);
                goto done;
            }
        }
        PyList_SET_ITEM(out, i, item);
    }
done:
    release_read(entries, n);
    Py_DECREF(seq);
    Py_DECREF(dir);
    return out;
}

static PyMethodDef methods[] = {
    {"read_files", read_files, METH_VARARGS,
     "read_files(directory, [name, ...], optional=0, max_bytes=64 MiB): the files' bytes (None for a missing "
     "one of the last ``optional``), the GIL let go once"},
    {"write_files", write_files, METH_VARARGS,
     "write_files(directory, [(name, data), ...], fsync, make_dir=False, prepared=False): make the files, "
     "the GIL let go once"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_files", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__files(void) { return PyModule_Create(&module); }
