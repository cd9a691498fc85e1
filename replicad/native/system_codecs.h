/*
 * The system's compression libraries (liblz4.so.1, libzstd.so.1: the libraries ClickHouse's blocks of this
 * machine are made with, as replicad/storage/compression.py loads them), loaded once with dlopen (no
 * headers needed to build), and the compressed block's layout, for the extensions that compress or
 * decompress blocks in C.  A thread keeps one zstd compression context (freed when the thread ends).
 * Static functions: each extension that includes this is its own shared object.
 */
#ifndef REPLICAD_SYSTEM_CODECS_H
#define REPLICAD_SYSTEM_CODECS_H

#include <Python.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define METHOD_NONE 0x02
#define METHOD_LZ4 0x82
#define METHOD_ZSTD 0x90

/* A compressed block: CityHash128 of the rest, then the header (method byte, UInt32 compressed size with
 * the header, UInt32 decompressed size), then the payload. */
#define CHECKSUM_SIZE 16
#define HEADER_SIZE 9
#define OVERHEAD (CHECKSUM_SIZE + HEADER_SIZE)

typedef size_t (*zstd_compress_fn)(void *, void *, size_t, const void *, size_t, int);
typedef size_t (*zstd_decompress_fn)(void *, size_t, const void *, size_t);
typedef size_t (*zstd_bound_fn)(size_t);
typedef unsigned (*zstd_is_error_fn)(size_t);
typedef void *(*zstd_create_fn)(void);
typedef size_t (*zstd_free_fn)(void *);
typedef int (*lz4_compress_fn)(const char *, char *, int, int);
typedef int (*lz4_decompress_fn)(const char *, char *, int, int);
typedef int (*lz4_bound_fn)(int);

static struct {
    int loaded;
    zstd_compress_fn compress;
    zstd_decompress_fn decompress;
    zstd_bound_fn bound;
    zstd_is_error_fn is_error;
    zstd_create_fn create;
    zstd_free_fn free_ctx;
    pthread_key_t ctx_key;
} zstd;

static struct {
    int loaded;
    lz4_compress_fn compress;
    lz4_decompress_fn decompress;
    lz4_bound_fn bound;
} lz4;

static inline void free_zstd_ctx(void *ctx) {
    if (ctx != NULL)
        zstd.free_ctx(ctx);
}

/* (GIL held) load the method's library once; 0, or -1 with OSError (ValueError: not a method) set */
static inline int load_method(int method) {
    if (method == METHOD_NONE)
        return 0;
    if (method == METHOD_ZSTD) {
        if (zstd.loaded)
            return 0;
        void *lib = dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL);
        if (lib == NULL) {
            PyErr_Format(PyExc_OSError, "cannot load libzstd.so.1: %s", dlerror());
            return -1;
        }
        zstd.compress = (zstd_compress_fn)dlsym(lib, "ZSTD_compressCCtx");
        zstd.decompress = (zstd_decompress_fn)dlsym(lib, "ZSTD_decompress");
        zstd.bound = (zstd_bound_fn)dlsym(lib, "ZSTD_compressBound");
        zstd.is_error = (zstd_is_error_fn)dlsym(lib, "ZSTD_isError");
        zstd.create = (zstd_create_fn)dlsym(lib, "ZSTD_createCCtx");
        zstd.free_ctx = (zstd_free_fn)dlsym(lib, "ZSTD_freeCCtx");
        if (!zstd.compress || !zstd.decompress || !zstd.bound || !zstd.is_error || !zstd.create ||
            !zstd.free_ctx) {
            PyErr_SetString(PyExc_OSError, "libzstd.so.1 lacks a ZSTD_ function");
            return -1;
        }
        if (pthread_key_create(&zstd.ctx_key, free_zstd_ctx) != 0) {
            PyErr_SetString(PyExc_OSError, "pthread_key_create failed");
            return -1;
        }
        zstd.loaded = 1;
        return 0;
    }
    if (method == METHOD_LZ4) {
        if (lz4.loaded)
            return 0;
        void *lib = dlopen("liblz4.so.1", RTLD_NOW | RTLD_LOCAL);
        if (lib == NULL) {
            PyErr_Format(PyExc_OSError, "cannot load liblz4.so.1: %s", dlerror());
            return -1;
        }
        lz4.compress = (lz4_compress_fn)dlsym(lib, "LZ4_compress_default");
        lz4.decompress = (lz4_decompress_fn)dlsym(lib, "LZ4_decompress_safe");
        lz4.bound = (lz4_bound_fn)dlsym(lib, "LZ4_compressBound");
        if (!lz4.compress || !lz4.decompress || !lz4.bound) {
            PyErr_SetString(PyExc_OSError, "liblz4.so.1 lacks an LZ4_ function");
            return -1;
        }
        lz4.loaded = 1;
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "unknown compression method byte 0x%02x", method);
    return -1;
}

/* the payload's capacity for n bytes (the method loaded) */
static inline size_t payload_bound(int method, size_t n) {
    if (method == METHOD_ZSTD)
        return zstd.bound(n);
    if (method == METHOD_LZ4)
        return (size_t)lz4.bound((int)n);
    return n;
}

/* compress n bytes of src into dst (cap bytes); the payload's size, or (size_t)-1 on a failure */
static inline size_t compress_payload(int method, int level, const uint8_t *src, size_t n, uint8_t *dst, size_t cap) {
    if (method == METHOD_ZSTD) {
        void *ctx = pthread_getspecific(zstd.ctx_key);
        if (ctx == NULL) {
            ctx = zstd.create();
            if (ctx == NULL || pthread_setspecific(zstd.ctx_key, ctx) != 0) {
                if (ctx != NULL)
                    zstd.free_ctx(ctx);
                return (size_t)-1;
            }
        }
        size_t size = zstd.compress(ctx, dst, cap, src, n, level);
        return zstd.is_error(size) ? (size_t)-1 : size;
    }
    if (method == METHOD_LZ4) {
        int size = lz4.compress((const char *)src, (char *)dst, (int)n, (int)cap);
        return size <= 0 ? (size_t)-1 : (size_t)size;
    }
    memcpy(dst, src, n);
    return n;
}

/* decompress a payload of n bytes into exactly size bytes at dst; 0, or -1 when it is not that (the
 * method loaded) */
static inline int decompress_payload(int method, const uint8_t *src, size_t n, uint8_t *dst, size_t size) {
    if (method == METHOD_ZSTD) {
        size_t got = zstd.decompress(dst, size, src, n);
        return zstd.is_error(got) || got != size ? -1 : 0;
    }
    if (method == METHOD_LZ4) {
        if (n > INT32_MAX || size > INT32_MAX)
            return -1;
        int got = lz4.decompress((const char *)src, (char *)dst, (int)n, (int)size);
        return got < 0 || (size_t)got != size ? -1 : 0;
    }
    if (n != size)
        return -1;
    memcpy(dst, src, n);
    return 0;
}

#endif
