/*
 * dlock clock shim: an LD_PRELOAD shared object that shifts a process's
 * wall clock by an offset read from a shared file, for the safety
 * harness's clock-jump fault (see package clock, doc.go).
 *
 * Overridden: gettimeofday, clock_gettime (CLOCK_REALTIME and
 * CLOCK_REALTIME_COARSE only; every other clock passes through untouched)
 * and time. The offset is a native-endian int64 of nanoseconds in the first
 * 8 bytes of the file named by $DLOCK_CLOCK_OFFSET_FILE, mapped MAP_SHARED
 * read-only: the writer (clock.Offset.Set) stores it atomically into its
 * own shared mapping of the same file, so every call after the store sees
 * the new offset. There is no polling and no re-reading.
 *
 * Constraints, because the target is Debian's jemalloc build of
 * redis-server (libfaketime deadlocks there: its lazy initialisation calls
 * dlsym, dlsym allocates, jemalloc's initialisation reads the clock, which
 * re-enters the half-initialised shim):
 *   - the hooks never allocate, never take a lock and never call dlsym;
 *   - dlsym(RTLD_NEXT) runs once, in the constructor; until it has
 *     returned, the hooks read the kernel clocks with raw syscalls, so a
 *     clock read from inside dlsym's own allocation does not recurse;
 *   - the offset file is mapped with raw syscalls (openat, fstat, mmap,
 *     close) in the constructor, or lazily by the first hook that runs
 *     before it, guarded by a compare-and-swap: a racing or re-entrant
 *     caller sees offset 0 instead of waiting;
 *   - after initialisation a hook is two atomic loads, the real (vDSO)
 *     clock read and integer arithmetic: async-signal-safe.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define SHIM_ENV "DLOCK_CLOCK_OFFSET_FILE"
#define NS_PER_SEC 1000000000LL

#define EXPORT __attribute__((visibility("default")))

typedef int (*gettimeofday_fn)(struct timeval *, void *);
typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);
typedef time_t (*time_fn)(time_t *);

/* Set once by the constructor; read with atomic loads. */
static gettimeofday_fn real_gettimeofday;
static clock_gettime_fn real_clock_gettime;

/* The mapped offset, or NULL (no file: offset 0). */
static const int64_t *offset_ptr;

/* 0: not mapped yet; 1: being mapped; 2: done (mapped or given up). */
static int map_state;

static void say(const char *msg) {
	size_t n = 0;
	while (msg[n] != '\0')
		n++;
	long r = syscall(SYS_write, 2, msg, n);
	(void)r;
}

static void map_offset(void) {
	int want = 0;
	if (!__atomic_compare_exchange_n(&map_state, &want, 1, 0,
					 __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return; /* done, or another caller is mapping: offset 0 meanwhile */
	const char *path = getenv(SHIM_ENV); /* reads environ; no allocation */
	if (path != NULL && path[0] != '\0') {
		long fd = syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
		if (fd < 0) {
			say("dlock clock shim: cannot open $" SHIM_ENV "; offset stays 0\n");
		} else {
			struct stat st;
			if (syscall(SYS_fstat, fd, &st) != 0 || st.st_size < 8) {
				say("dlock clock shim: $" SHIM_ENV " is shorter than 8 bytes; offset stays 0\n");
			} else {
				long p = syscall(SYS_mmap, NULL, 8, PROT_READ, MAP_SHARED, fd, 0);
				if (p < 0 && p > -4096) {
					say("dlock clock shim: cannot mmap $" SHIM_ENV "; offset stays 0\n");
				} else {
					__atomic_store_n(&offset_ptr, (const int64_t *)p, __ATOMIC_RELEASE);
				}
			}
			syscall(SYS_close, fd);
		}
	}
	__atomic_store_n(&map_state, 2, __ATOMIC_RELEASE);
}

static int64_t offset_ns(void) {
	if (__atomic_load_n(&map_state, __ATOMIC_ACQUIRE) == 0)
		map_offset();
	const int64_t *p = __atomic_load_n(&offset_ptr, __ATOMIC_ACQUIRE);
	if (p == NULL)
		return 0;
	return __atomic_load_n(p, __ATOMIC_RELAXED);
}

/* The real clock: the next definition (glibc's vDSO-backed one), or the
 * raw syscall before the constructor has resolved it. */
static int read_clock(clockid_t id, struct timespec *ts) {
	clock_gettime_fn f = __atomic_load_n(&real_clock_gettime, __ATOMIC_ACQUIRE);
	if (f != NULL)
		return f(id, ts);
	return (int)syscall(SYS_clock_gettime, id, ts);
}

/* Adds off nanoseconds to ts, keeping tv_nsec in [0, 1e9). */
static void shift(struct timespec *ts, int64_t off) {
	if (off == 0)
		return;
	int64_t ns = (int64_t)ts->tv_sec * NS_PER_SEC + ts->tv_nsec + off;
	int64_t sec = ns / NS_PER_SEC, rem = ns % NS_PER_SEC;
	if (rem < 0) {
		rem += NS_PER_SEC;
		sec--;
	}
	ts->tv_sec = (time_t)sec;
	ts->tv_nsec = (long)rem;
}

static int is_realtime(clockid_t id) {
	return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE;
}

EXPORT int clock_gettime(clockid_t id, struct timespec *ts) {
	int r = read_clock(id, ts);
	if (r == 0 && is_realtime(id))
		shift(ts, offset_ns());
	return r;
}

/* Defined under another name and exported by alias: glibc declares
 * gettimeofday's tv nonnull, which would let the compiler drop the NULL
 * check, and a NULL tv is a valid (if odd) call. */
static int shim_gettimeofday(struct timeval *tv, void *tz) {
	gettimeofday_fn f = __atomic_load_n(&real_gettimeofday, __ATOMIC_ACQUIRE);
	int r;
	if (f != NULL)
		r = f(tv, tz);
	else
		r = (int)syscall(SYS_gettimeofday, tv, tz);
	if (r != 0 || tv == NULL)
		return r;
	int64_t off = offset_ns();
	if (off == 0)
		return r;
	struct timespec ts = {.tv_sec = tv->tv_sec, .tv_nsec = tv->tv_usec * 1000L};
	shift(&ts, off);
	tv->tv_sec = ts.tv_sec;
	tv->tv_usec = ts.tv_nsec / 1000L;
	return r;
}

extern __typeof(shim_gettimeofday) gettimeofday
	__attribute__((alias("shim_gettimeofday"), visibility("default")));

/* time() is CLOCK_REALTIME_COARSE's seconds, as glibc's vDSO time() is. */
EXPORT time_t time(time_t *tloc) {
	struct timespec ts;
	if (read_clock(CLOCK_REALTIME_COARSE, &ts) != 0)
		return (time_t)-1;
	shift(&ts, offset_ns());
	if (tloc != NULL)
		*tloc = ts.tv_sec;
	return ts.tv_sec;
}

__attribute__((constructor)) static void shim_init(void) {
	map_offset();
	/* dlsym may allocate; an allocator that reads the clock meanwhile
	 * lands in the hooks above, which use raw syscalls until these
	 * stores. */
	void *g = dlsym(RTLD_NEXT, "gettimeofday");
	void *c = dlsym(RTLD_NEXT, "clock_gettime");
	__atomic_store_n(&real_gettimeofday, (gettimeofday_fn)g, __ATOMIC_RELEASE);
	__atomic_store_n(&real_clock_gettime, (clock_gettime_fn)c, __ATOMIC_RELEASE);
}
