/* Shifts the wall clock of the process it is preloaded into by IDEM_SKEW_SECONDS (negative:
 * behind), leaving the monotonic clock true: the clock tests' worker whose host clock is wrong.
 * Built and preloaded by `idem_tests::skew`. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long skew_seconds(void) {
    static long skew;
    static int read;
    if (!read) {
        const char *text = getenv("IDEM_SKEW_SECONDS");
        skew = text ? atol(text) : 0;
        read = 1;
    }
    return skew;
}

int clock_gettime(clockid_t clock, struct timespec *now) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real) {
        real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    }
    int result = real(clock, now);
    if (result == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
        now->tv_sec += skew_seconds();
    }
    return result;
}

int gettimeofday(struct timeval *now, void *zone) {
    static int (*real)(struct timeval *, void *);
    if (!real) {
        real = (int (*)(struct timeval *, void *))dlsym(RTLD_NEXT, "gettimeofday");
    }
    int result = real(now, zone);
    if (result == 0 && now) {
        now->tv_sec += skew_seconds();
    }
    return result;
}

time_t time(time_t *out) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (out) {
        *out = now.tv_sec;
    }
    return now.tv_sec;
}
