/* A skewed wall clock for one process (LD_PRELOAD), for the chaos suite's clock nemeses (tests/chaos/clock.py).
 *
 * Only CLOCK_REALTIME (and its coarse variant, gettimeofday, time) is changed:
 *     faked = start + (real - start) * CHAOS_CLOCK_RATE + CHAOS_CLOCK_OFFSET_NS
 * where start is the real time when the library was loaded.  CLOCK_MONOTONIC, CLOCK_BOOTTIME, sleeps and
 * timed waits are left alone: nothing here intercepts them.  (libfaketime 0.9.10 does, and breaks Python:
 * with the monotonic clock faked its timed waits hang, without it time.sleep fails with EINVAL, because its
 * clock_nanosleep converts an absolute CLOCK_MONOTONIC deadline as if it were faked wall-clock time.)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static int (*real_clock_gettime)(clockid_t, struct timespec *);
static int64_t offset_ns;
static double rate = 1.0;
static int64_t start_ns;

static int64_t ns_of(const struct timespec *ts) { return (int64_t)ts->tv_sec * 1000000000LL + ts->tv_nsec; }

__attribute__((constructor)) static void fakeclock_init(void) {
    real_clock_gettime = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    const char *o = getenv("CHAOS_CLOCK_OFFSET_NS");
    const char *r = getenv("CHAOS_CLOCK_RATE");
    if (o != NULL) offset_ns = strtoll(o, NULL, 10);
    if (r != NULL) rate = strtod(r, NULL);
    struct timespec now;
    if (real_clock_gettime != NULL && real_clock_gettime(CLOCK_REALTIME, &now) == 0) start_ns = ns_of(&now);
}

static void fake(struct timespec *ts) {
    int64_t real = ns_of(ts);
    int64_t faked = start_ns + (int64_t)((double)(real - start_ns) * rate) + offset_ns;
    ts->tv_sec = faked / 1000000000LL;
    ts->tv_nsec = faked % 1000000000LL;
    if (ts->tv_nsec < 0) {
        ts->tv_nsec += 1000000000LL;
        ts->tv_sec -= 1;
    }
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
    if (real_clock_gettime == NULL) fakeclock_init();
    int rc = real_clock_gettime(clk, ts);
    if (rc == 0 && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE)) fake(ts);
    return rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
    if (out != NULL) *out = ts.tv_sec;
    return ts.tv_sec;
}
