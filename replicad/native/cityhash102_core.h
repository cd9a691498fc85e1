/*
 * CityHash v1.0.2, 128-bit variants (ch128, ch128_seed), and ClickHouse's chained "hashing buffer" file
 * hash (whole_file_hash: 2048-byte chunks, each CityHash128WithSeed(chunk, state) from a zero state), as
 * static functions for the extensions that hash (cityhash102.c, wholepart.c, partread.c).  Values are
 * (lo, hi).
 */
#ifndef REPLICAD_CITYHASH102_CORE_H
#define REPLICAD_CITYHASH102_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define CH_CHUNK 2048

typedef struct {
    uint64_t lo;
    uint64_t hi;
} u128;

static const uint64_t K0 = 0xc3a5c85c97cb3127ULL;
static const uint64_t K1 = 0xb492b66fbe98f273ULL;
static const uint64_t K2 = 0x9ae16a3b2f90404fULL;
static const uint64_t K3 = 0xc949d7c7509e6557ULL;

static inline uint64_t load64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint32_t load32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

/* rotate right; a zero shift leaves the value alone */
static inline uint64_t rotr(uint64_t v, unsigned s) {
    return s == 0 ? v : ((v >> s) | (v << (64 - s)));
}

/* rotate right by 1..63 */
static inline uint64_t rotr_nz(uint64_t v, unsigned s) {
    return (v >> s) | (v << (64 - s));
}

static inline uint64_t shift_mix(uint64_t v) {
    return v ^ (v >> 47);
}

/* 128 -> 64 bit reduction (Murmur-inspired) */
static inline uint64_t mix128(uint64_t lo, uint64_t hi) {
    const uint64_t m = 0x9ddfea08eb382d69ULL;
    uint64_t a = (lo ^ hi) * m;
    a ^= a >> 47;
    uint64_t b = (hi ^ a) * m;
    b ^= b >> 47;
    return b * m;
}

static inline uint64_t hash_short(const uint8_t *s, size_t n) {
    if (n > 8) {
        uint64_t a = load64(s);
        uint64_t b = load64(s + n - 8);
        return mix128(a, rotr_nz(b + n, (unsigned)n)) ^ b;
    }
    if (n >= 4) {
        uint64_t a = load32(s);
        return mix128(n + (a << 3), load32(s + n - 4));
    }
    if (n > 0) {
        uint8_t a = s[0], b = s[n >> 1], c = s[n - 1];
        uint32_t y = (uint32_t)a + ((uint32_t)b << 8);
        uint32_t z = (uint32_t)n + ((uint32_t)c << 2);
        return shift_mix((uint64_t)y * K2 ^ (uint64_t)z * K3) * K2;
    }
    return K2;
}

/* 32 bytes at s mixed with two seeds; result in *r */
static inline void weak32(const uint8_t *s, uint64_t a, uint64_t b, u128 *r) {
    uint64_t w = load64(s), x = load64(s + 8), y = load64(s + 16), z = load64(s + 24);
    a += w;
    b = rotr(b + a + z, 21);
    uint64_t c = a;
    a += x;
    a += y;
    b += rotr(a, 44);
    r->lo = a + z;
    r->hi = b + c;
}

/* the short-input (< 128 bytes) path of the seeded 128-bit hash */
static inline u128 murmur_path(const uint8_t *s, size_t n, u128 seed) {
    uint64_t a = seed.lo, b = seed.hi, c, d;
    long rest = (long)n - 16;
    if (rest <= 0) {
        a = shift_mix(a * K1) * K1;
        c = b * K1 + hash_short(s, n);
        d = shift_mix(a + (n >= 8 ? load64(s) : c));
    } else {
        c = mix128(load64(s + n - 8) + K1, a);
        d = mix128(b + n, c + load64(s + n - 16));
        a += d;
        do {
            a ^= shift_mix(load64(s) * K1) * K1;
            a *= K1;
            b ^= a;
            c ^= shift_mix(load64(s + 8) * K1) * K1;
            c *= K1;
            d ^= c;
            s += 16;
            rest -= 16;
        } while (rest > 0);
    }
    a = mix128(a, c);
    b = mix128(d, b);
    u128 r = {a ^ b, mix128(b, a)};
    return r;
}

static inline u128 ch128_seed(const uint8_t *s, size_t n, u128 seed) {
    if (n < 128)
        return murmur_path(s, n, seed);

    uint64_t x = seed.lo, y = seed.hi, z = (uint64_t)n * K1, t;
    u128 v, w;
    v.lo = rotr(y ^ K1, 49) * K1 + load64(s);
    v.hi = rotr(v.lo, 42) * K1 + load64(s + 8);
    w.lo = rotr(y + z, 35) * K1 + x;
    w.hi = rotr(x + load64(s + 88), 53) * K1;

    do {
        for (int half = 0; half < 2; half++) {
            x = rotr(x + y + v.lo + load64(s + 16), 37) * K1;
            y = rotr(y + v.hi + load64(s + 48), 42) * K1;
            x ^= w.hi;
            y ^= v.lo;
            z = rotr(z ^ w.lo, 33);
            weak32(s, v.hi * K1, x + w.lo, &v);
            weak32(s + 32, z + w.hi, y, &w);
            t = z;
            z = x;
            x = t;
            s += 64;
        }
        n -= 128;
    } while (n >= 128);

    y += rotr(w.lo, 37) * K0 + z;
    x += rotr(v.lo + z, 49) * K0;
    /* up to four 32-byte pieces taken backwards from the end */
    for (size_t done = 0; done < n;) {
        done += 32;
        y = rotr(y - x, 42) * K0 + v.hi;
        w.lo += load64(s + n - done + 16);
        x = rotr(x, 49) * K0 + w.lo;
        w.lo += v.lo;
        weak32(s + n - done, v.lo, v.hi, &v);
    }
    x = mix128(x, v.lo);
    y = mix128(y, w.lo);
    u128 r = {mix128(x + v.hi, w.hi) + y, mix128(x + w.hi, y + v.hi)};
    return r;
}

static inline u128 ch128(const uint8_t *s, size_t n) {
    u128 seed;
    if (n >= 16) {
        seed.lo = load64(s) ^ K3;
        seed.hi = load64(s + 8);
        return ch128_seed(s + 16, n - 16, seed);
    }
    if (n >= 8) {
        seed.lo = load64(s) ^ ((uint64_t)n * K0);
        seed.hi = load64(s + n - 8) ^ K1;
        return ch128_seed(s, 0, seed);
    }
    seed.lo = K0;
    seed.hi = K1;
    return ch128_seed(s, n, seed);
}

/* chain whole chunks of data into state; returns the number of bytes consumed */
static inline size_t chain_chunks(u128 *state, const uint8_t *p, size_t n) {
    size_t used = 0;
    while (n - used >= CH_CHUNK) {
        *state = ch128_seed(p + used, CH_CHUNK, *state);
        used += CH_CHUNK;
    }
    return used;
}

static inline u128 whole_file_hash(const uint8_t *p, size_t n) {
    u128 st = {0, 0};
    size_t used = chain_chunks(&st, p, n);
    if (used < n)
        st = ch128_seed(p + used, n - used, st);
    return st;
}

#endif
