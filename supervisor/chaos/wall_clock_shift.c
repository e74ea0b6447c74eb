/* A wall clock shifted by a fixed offset, for one process tree: an LD_PRELOAD library.
 *
 * Built and used by supervisor/chaos/wall_clock.py (see its docstring for why). It overrides
 * the libc calls a process reads the wall clock through, adding the offset (milliseconds, may
 * be negative) read once from $YIELDSTAR_WALL_CLOCK_OFFSET_MS:
 *
 *   clock_gettime   CLOCK_REALTIME, CLOCK_REALTIME_COARSE and CLOCK_TAI are shifted; every
 *                   other clock (CLOCK_MONOTONIC above all, which the runtime's timing and its
 *                   estimate of the database server's clock ride on) is the real one, untouched;
 *   gettimeofday, time, timespec_get (TIME_UTC)
 *                   shifted.
 *
 * The real calls are found with dlsym(RTLD_NEXT), so a shifted read costs what a real one does
 * (the vDSO's) plus an addition. Children inherit the environment, hence the shift, unless a
 * parent clears LD_PRELOAD.
 */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define OFFSET_VARIABLE "YIELDSTAR_WALL_CLOCK_OFFSET_MS"
#define NS_PER_S 1000000000LL

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);
typedef int (*gettimeofday_fn)(struct timeval *, void *);

static int64_t offset_ns;
static clock_gettime_fn real_clock_gettime;
static gettimeofday_fn real_gettimeofday;
static int ready;

/* Read the offset and find the real calls: at load time (the constructor, before any thread
 * exists), or at the first call if another library's constructor reads the clock before ours
 * has run. Two threads racing here compute the same values. */
static void init(void) {
    if (__atomic_load_n(&ready, __ATOMIC_ACQUIRE))
        return;
    const char *text = getenv(OFFSET_VARIABLE);
    int64_t ms = text ? strtoll(text, NULL, 10) : 0;
    __atomic_store_n(&offset_ns, ms * 1000000LL, __ATOMIC_RELAXED);
    __atomic_store_n(&real_clock_gettime, (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime"), __ATOMIC_RELAXED);
    __atomic_store_n(&real_gettimeofday, (gettimeofday_fn)dlsym(RTLD_NEXT, "gettimeofday"), __ATOMIC_RELAXED);
    __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
}

__attribute__((constructor)) static void load(void) { init(); }

static int read_clock(clockid_t id, struct timespec *ts) {
    init();
    if (real_clock_gettime)
        return real_clock_gettime(id, ts);
    return (int)syscall(SYS_clock_gettime, id, ts);
}

static void shift(struct timespec *ts) {
    int64_t ns = (int64_t)ts->tv_nsec + offset_ns % NS_PER_S;
    ts->tv_sec += offset_ns / NS_PER_S + ns / NS_PER_S;
    ns %= NS_PER_S;
    if (ns < 0) {
        ns += NS_PER_S;
        ts->tv_sec -= 1;
    }
    ts->tv_nsec = (long)ns;
}

static int shifted(clockid_t id) {
    return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE || id == CLOCK_TAI;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int done = read_clock(id, ts);
    if (done == 0 && shifted(id))
        shift(ts);
    return done;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    init();
    int done = real_gettimeofday ? real_gettimeofday(tv, tz) : (int)syscall(SYS_gettimeofday, tv, tz);
    if (done == 0 && tv) {  /* a caller may ask for the time zone alone */
        struct timespec ts = {tv->tv_sec, tv->tv_usec * 1000L};
        shift(&ts);
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000L;
    }
    return done;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return (time_t)-1;
    if (out)
        *out = ts.tv_sec;
    return ts.tv_sec;
}

int timespec_get(struct timespec *ts, int base) {
    if (base != TIME_UTC || clock_gettime(CLOCK_REALTIME, ts) != 0)
        return 0;
    return base;
}
