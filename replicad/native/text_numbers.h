/* Plain integer and date texts read straight to their values: the one reading of textints.c (which parses
 * the rows of an Arrow string column) and of the text splitters (tsvsplit.c, csvsplit.c: typed columns
 * read from the field bounds of a block, no copy of the text).  Included by each extension (each is its
 * own shared object).
 *
 * Typed column kinds (one byte per column, the splitters' `kinds` argument):
 *   's'                 no typed reading: the field texts (an Arrow binary column)
 *   'B' 'H' 'I' 'Q'     unsigned 8/16/32/64-bit integers, plain decimal digits (as textints.parse)
 *   'b' 'h' 'i' 'q'     signed ones, one leading '-' allowed
 *   'D'                 Date: `YYYY-MM-DD` (as textints.dates) to int32 days, 0..65535 only
 *   'T'                 DateTime in UTC: `YYYY-MM-DD hh:mm:ss` ('T' allowed for the space) to int64
 *                       seconds, 0..2^32-1 only
 *   't'                 DateTime in another time zone: int64 local seconds, 2 days away from both ends of
 *                       0..2^32-1 (no UTC offset can then take the time out of range)
 *   'F' 'f'             Float64 / Float32: `[-]digits[.digits][(e|E)[+|-]digits]`, at most 64 bytes, whose
 *                       significand (at most 19 digits after leading zeros) is at most 2^53 and whose
 *                       decimal exponent is within -22..22 (or zero): read as the nearest double by
 *                       Clinger's exact fast path (correctly rounded, as pyarrow's cast of the same text),
 *                       Float32 that double rounded to float (as the general path's cast to float64 then
 *                       float32)
 * A column with a row outside these shapes or ranges is not read: the caller gets its texts and the general
 * path converts them (and words the error). */
#ifndef REPLICAD_TEXT_NUMBERS_H
#define REPLICAD_TEXT_NUMBERS_H

#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* 1 and *out set when s[0, len) is plain decimal digits (one leading '-' when is_signed) within the
 * range of the `bits`-bit type; else 0.  Up to 19 digits are combined eight at a time (SWAR). */
static inline int plain_integer(const uint8_t *s, Py_ssize_t len, int is_signed, int bits, uint64_t *out) {
    uint64_t umax = bits == 64 ? UINT64_MAX : ((uint64_t)1 << bits) - 1;
    uint64_t smax = ((uint64_t)1 << (bits - 1)) - 1;
    Py_ssize_t i = 0;
    int neg = 0;
    if (is_signed && len > 0 && s[0] == '-') {
        neg = 1;
        i = 1;
    }
    if (i >= len || len - i > 20)
        return 0;
    uint64_t v = 0;
    if (len - i <= 19) { /* below 10^19: cannot pass 64 bits, no overflow check per digit */
        while (len - i >= 8) { /* eight digits at a time (SWAR, as fast_float parses them) */
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (((w + 0x4646464646464646ULL) | (w - 0x3030303030303030ULL)) & 0x8080808080808080ULL)
                return 0; /* a byte that is not a digit */
            w -= 0x3030303030303030ULL;
            w = w * 10 + (w >> 8);
            w = (((w & 0x000000FF000000FFULL) * 0x000F424000000064ULL) +
                 (((w >> 16) & 0x000000FF000000FFULL) * 0x0000271000000001ULL)) >> 32;
            v = v * 100000000ULL + (uint32_t)w;
            i += 8;
        }
        for (; i < len; i++) {
            unsigned d = (unsigned)s[i] - '0';
            if (d > 9)
                return 0;
            v = v * 10 + d;
        }
    }
    for (; i < len; i++) {
        unsigned d = (unsigned)s[i] - '0';
        if (d > 9)
            return 0;
        if (v > (UINT64_MAX - d) / 10)
            return 0; /* beyond 64 bits */
        v = v * 10 + d;
    }
    if (is_signed) {
        if (neg ? v > smax + 1 : v > smax)
            return 0;
        *out = neg ? (uint64_t)0 - v : v;
    } else {
        if (v > umax)
            return 0;
        *out = v;
    }
    return 1;
}

/* Days since 1970-01-01 of a proleptic Gregorian date (the same formula as dates.py's numpy one). */
static inline int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static inline int month_length(int64_t y, int64_t m) {
    static const int len[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return len[m - 1] + (m == 2 && leap);
}

/* Two digits at p (0..99), or -1. */
static inline int two(const uint8_t *p) {
    unsigned a = (unsigned)p[0] - '0', b = (unsigned)p[1] - '0';
    return a <= 9 && b <= 9 ? (int)(a * 10 + b) : -1;
}

/* 1 and *out set when p[0, len) is `YYYY-MM-DD` (with_time: `YYYY-MM-DD hh:mm:ss`, 'T' allowed for the
 * space) with a year 1900..2299, a real calendar day, hh < 24, mm and ss < 60: days since 1970-01-01
 * (with_time: local seconds since then); else 0. */
static inline int fixed_date(const uint8_t *p, Py_ssize_t len, int with_time, int64_t *out) {
    if (len != (with_time ? 19 : 10))
        return 0;
    int hi = two(p), lo = two(p + 2), m = two(p + 5), d = two(p + 8);
    if (hi < 0 || lo < 0 || m < 0 || d < 0 || p[4] != '-' || p[7] != '-')
        return 0;
    int64_t y = hi * 100 + lo;
    if (y < 1900 || y >= 2300 || m < 1 || m > 12 || d < 1 || d > month_length(y, m))
        return 0;
    int64_t v = days_from_civil(y, m, d);
    if (with_time) {
        int hh = two(p + 11), mm = two(p + 14), ss = two(p + 17);
        if ((p[10] != ' ' && p[10] != 'T') || p[13] != ':' || p[16] != ':' || hh < 0 || hh >= 24 || mm < 0 ||
            mm >= 60 || ss < 0 || ss >= 60)
            return 0;
        v = v * 86400 + hh * 3600 + mm * 60 + ss;
    }
    *out = v;
    return 1;
}

#define PLAIN_FLOAT_MAX 64

/* Exact powers of ten as doubles (10^0 .. 10^22 are all representable). */
static const double exact_powers_of_ten[23] = {
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* The decimal digits from s[*i] on, each added to the significand *w (leading zeros skipped: *sig counts
 * the significant digits of the whole text); how many digits were read, or -1 past 19 significant ones. */
static inline Py_ssize_t take_digits(const uint8_t *s, Py_ssize_t len, Py_ssize_t *i, uint64_t *w, int *sig) {
    Py_ssize_t start = *i;
    for (; *i < len && s[*i] >= '0' && s[*i] <= '9'; (*i)++) {
        if (*w == 0 && s[*i] == '0')
            continue;
        if (++*sig > 19)
            return -1;
        *w = *w * 10 + (uint64_t)(s[*i] - '0');
    }
    return *i - start;
}

/* 1 and *out set when s[0, len) is a plain decimal float text (see 'F' above) within Clinger's fast path,
 * read in one pass; else 0 (the column's texts then go to pyarrow's cast).  When the decimal significand w
 * (the digits without the point) is at most 2^53 and the decimal exponent q within -22..22, w and 10^|q|
 * are exact doubles and one IEEE multiplication or division rounds w * 10^q correctly (the nearest double,
 * as any correct parser gives).  (x86-64 evaluates doubles in SSE2: no extended precision.) */
static inline int plain_float(const uint8_t *s, Py_ssize_t len, double *out) {
    Py_ssize_t i = 0, n;
    int neg = 0, sig = 0;
    uint64_t w = 0;
    long q = 0;
    if (len <= 0 || len > PLAIN_FLOAT_MAX)
        return 0;
    if (s[0] == '-') {
        neg = 1;
        i = 1;
    }
    if (take_digits(s, len, &i, &w, &sig) <= 0)
        return 0;
    if (i < len && s[i] == '.') {
        i++;
        if ((n = take_digits(s, len, &i, &w, &sig)) <= 0)
            return 0;
        q -= (long)n;
    }
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        int eneg = 0;
        long e = 0;
        i++;
        if (i < len && (s[i] == '+' || s[i] == '-'))
            eneg = s[i++] == '-';
        Py_ssize_t start = i;
        for (; i < len && s[i] >= '0' && s[i] <= '9'; i++)
            if (e <= 100000) /* past it no significand but zero stays in range */
                e = e * 10 + (s[i] - '0');
        if (i == start)
            return 0;
        q += eneg ? -e : e;
    }
    if (i != len)
        return 0;
    double v;
    if (w == 0)
        v = 0.0; /* zero whatever the exponent */
    else if (w > ((uint64_t)1 << 53) || q < -22 || q > 22)
        return 0;
    else
        v = q < 0 ? (double)w / exact_powers_of_ten[-q] : (double)w * exact_powers_of_ten[q];
    *out = neg ? -v : v;
    return 1;
}

/* Bytes per value of a typed kind; 0 for 's' and unknown kinds. */
static inline int kind_size(char kind) {
    switch (kind) {
    case 'B': case 'b': return 1;
    case 'H': case 'h': return 2;
    case 'I': case 'i': case 'D': case 'f': return 4;
    case 'Q': case 'q': case 'T': case 't': case 'F': return 8;
    default: return 0;
    }
}

/* One field read as `kind` into out[r] (kind_size(kind) bytes per row, little-endian).  1 ok, 0 not. */
static inline int typed_field(const uint8_t *s, Py_ssize_t len, char kind, uint8_t *out, Py_ssize_t r) {
    uint64_t u;
    int64_t v;
    switch (kind) {
    case 'B': case 'b':
        if (!plain_integer(s, len, kind == 'b', 8, &u))
            return 0;
        out[r] = (uint8_t)u;
        return 1;
    case 'H': case 'h': {
        if (!plain_integer(s, len, kind == 'h', 16, &u))
            return 0;
        uint16_t x = (uint16_t)u;
        memcpy(out + 2 * r, &x, 2);
        return 1;
    }
    case 'I': case 'i': {
        if (!plain_integer(s, len, kind == 'i', 32, &u))
            return 0;
        uint32_t x = (uint32_t)u;
        memcpy(out + 4 * r, &x, 4);
        return 1;
    }
    case 'Q': case 'q':
        if (!plain_integer(s, len, kind == 'q', 64, &u))
            return 0;
        memcpy(out + 8 * r, &u, 8);
        return 1;
    case 'D': {
        if (!fixed_date(s, len, 0, &v) || v < 0 || v > 0xFFFF)
            return 0;
        int32_t x = (int32_t)v;
        memcpy(out + 4 * r, &x, 4);
        return 1;
    }
    case 'F': case 'f': {
        double d;
        if (!plain_float(s, len, &d))
            return 0;
        if (kind == 'F') {
            memcpy(out + 8 * r, &d, 8);
            return 1;
        }
        float x = (float)d;
        if (!isfinite(x))
            return 0; /* past Float32's range: the general path says what it does with it */
        memcpy(out + 4 * r, &x, 4);
        return 1;
    }
    case 'T': case 't': {
        int64_t margin = kind == 't' ? 2 * 86400 : 0;
        if (!fixed_date(s, len, 1, &v) || v < margin || v > (int64_t)0xFFFFFFFF - margin)
            return 0;
        memcpy(out + 8 * r, &v, 8);
        return 1;
    }
    default:
        return 0;
    }
}

/* Field r of a column: s[bounds[r * stride], bounds[r * stride + 1]), read only when its splitter's kind
 * field_kinds[r * kinds_stride] is `plain` (the field's text as written; field_kinds NULL: every field
 * is).  1 when every row reads as `kind` into out, else 0. */
static inline int typed_rows(const uint8_t *s, const int32_t *bounds, Py_ssize_t stride, Py_ssize_t rows,
                             char kind, const uint8_t *field_kinds, Py_ssize_t kinds_stride, uint8_t plain,
                             uint8_t *out) {
    for (Py_ssize_t r = 0; r < rows; r++) {
        const int32_t *b = bounds + r * stride;
        if (field_kinds && field_kinds[r * kinds_stride] != plain)
            return 0;
        if (!typed_field(s + b[0], (Py_ssize_t)b[1] - b[0], kind, out, r))
            return 0;
    }
    return 1;
}

/* The value buffers of a split block's typed columns, then their fields read as values.  For each column c
 * whose kinds[c] has a size (and, with `valued`, a value in every row): a buffer of rows * size bytes from
 * alloc(n) in vals[c], its view in val_views[c], and typed[c] = kinds[c], reset to 0 when some field is not
 * of the kind (the column is then split as texts).  spans / field_kinds: the splitter's field bounds and
 * kinds, row-major; `plain` the kind of a field to read as written.  0, or -1 with an exception set (what
 * was acquired is in vals / val_views for the caller to release). */
static inline int typed_columns(const uint8_t *s, PyObject *alloc, Py_ssize_t width, Py_ssize_t rows,
                                const char *kinds, const Py_ssize_t *valued, const int32_t *spans,
                                const uint8_t *field_kinds, uint8_t plain, PyObject **vals,
                                Py_buffer *val_views, char *typed) {
    for (Py_ssize_t c = 0; kinds && c < width; c++) {
        int size = kind_size(kinds[c]);
        if (!size || (valued && valued[c] != rows))
            continue;
        vals[c] = PyObject_CallFunction(alloc, "n", rows * size);
        if (!vals[c])
            return -1;
        if (PyObject_GetBuffer(vals[c], &val_views[c], PyBUF_WRITABLE) < 0) {
            Py_CLEAR(vals[c]);
            return -1;
        }
        typed[c] = kinds[c];
        if (val_views[c].len < rows * size) {
            PyErr_SetString(PyExc_ValueError, "alloc returned a buffer too short");
            return -1;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t c = 0; c < width; c++)
        if (typed[c] && rows &&
            !typed_rows(s, spans + 2 * c, 2 * width, rows, typed[c], field_kinds + c, width, plain,
                        (uint8_t *)val_views[c].buf))
            typed[c] = 0; /* some field is not of the kind: the column's texts instead */
    Py_END_ALLOW_THREADS
    return 0;
}

/* Releases what typed_columns acquired and frees the three arrays (each may be NULL). */
static inline void typed_columns_free(Py_ssize_t width, PyObject **vals, Py_buffer *val_views, char *typed) {
    for (Py_ssize_t c = 0; vals && c < width; c++) {
        if (vals[c]) {
            PyBuffer_Release(&val_views[c]);
            Py_DECREF(vals[c]);
        }
    }
    free(vals);
    free(val_views);
    free(typed);
}

#endif
