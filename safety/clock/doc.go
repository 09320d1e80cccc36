// Package clock jumps a server's wall clock for the safety harness's
// clock-jump fault: an LD_PRELOAD shim (shim/shim.c, embedded and compiled
// by Build with the system C compiler) shifts the process's wall clock by
// an offset that the harness changes while the server runs (Offset.Set).
// libfaketime is not used: it hangs Debian's jemalloc build of
// redis-server at start-up.
//
//	so, err := clock.Build(dir)                    // needs cc or gcc
//	off, err := clock.NewOffset(filepath.Join(dir, "offset")) // before the server starts
//	cmd.Env = append(os.Environ(), clock.Env(so, off.Path())...)
//	...
//	off.Set(time.Hour)  // the server's clock is now 1h ahead
//	off.Set(0)          // and back to real time
//
// # What is shimmed
//
// gettimeofday, clock_gettime for CLOCK_REALTIME and CLOCK_REALTIME_COARSE,
// and time (computed from CLOCK_REALTIME_COARSE, as glibc's is) return real
// time plus the offset. Every other clock, CLOCK_MONOTONIC included, passes
// through untouched.
//
// That covers Redis's key expiry. In Redis 7.0 (checked on Debian's
// redis-server 7.0.15 by disassembly: its only imported clock functions are
// gettimeofday, clock_gettime and time) expiry reads the wall clock through
// mstime()/ustime(), which call gettimeofday: keyIsExpired (lazy expiry on
// access), activeExpireCycle (the background sweep), the cached
// server.mstime that updateCachedTime refreshes around each command (used
// for expiry while a command or script runs), checkAlreadyExpired (SET
// with PX/EX/PXAT, EXPIRE), PTTL and TIME. Blocking-command timeouts
// (BLPOP ...) and the idle-client timeout are wall-clock deadlines too and
// jump with it. clock_gettime is called only with CLOCK_MONOTONIC, by
// Redis's monotonic clock (monotonicInit/getMonotonicUs), which paces the
// event loop's timers (serverCron) and measures durations, not key expiry:
// it is left alone, so the server keeps its pace through a jump. time()
// feeds LASTSAVE, INFO fields, the latency monitor and logs.
//
// # How fast a jump is seen
//
// Immediately: the offset is one int64 in a file that the shim maps
// shared and read-only at start-up and Offset maps shared read-write; Set
// is a single atomic 8-byte store into that page, and every clock read in
// every shimmed process loads it (no polling, no system call). Redis sees a
// jump at its next clock read, so the next command already runs on the new
// clock; keys not accessed expire by the active expire cycle (10 times a
// second by default). A process started, or restarted after a crash, later
// begins at the current offset.
//
// A forward jump expires every key whose expiry the new clock has passed.
// A backward jump makes keys live longer: expiry times are absolute
// wall-clock instants, so a key with 10s to live on a clock set back 1h
// lives 1h10s (PTTL says so) and gets its 10s back when the clock returns.
// The same holds across a restart with persistence: the RDB and AOF store
// absolute expiry instants (checked by hand with --appendonly yes,
// BGREWRITEAOF and BGSAVE under the shim: forked children inherit the
// mapping and keep the offset).
//
// # Constraints and what is not covered
//
// The shim never allocates, locks or calls dlsym from a hooked call:
// dlsym(RTLD_NEXT) runs once in its constructor, hooks read the kernel with
// raw syscalls until it has, and the file is mapped with raw syscalls. A
// hooked call after start-up is two atomic loads, the real vDSO read and
// arithmetic, safe in signal handlers.
//
// Not covered: clocks read without going through libc's gettimeofday,
// clock_gettime or time (raw syscalls, a direct vDSO call, inline rdtsc,
// statically linked binaries), other functions (timespec_get, ftime,
// CLOCK_TAI, CLOCK_BOOTTIME, timerfd and timer deadlines, file times), Go
// programs (the Go runtime reads the vDSO itself, so LD_PRELOAD cannot
// shift etcd or any Go server), and setuid binaries (the loader ignores
// LD_PRELOAD). The whole process moves together: a per-thread or
// per-connection clock is not possible. Env sets LD_PRELOAD to the shim
// alone, replacing an inherited one. The offset file must be created
// before the process starts (a process that found no file, or one shorter
// than 8 bytes, runs on real time for good and says so on stderr) and must
// not be replaced or truncated while a process maps it (a rename leaves it
// on the old file; a truncation kills it with SIGBUS on its next clock read).
// The offset is in native byte order: writer and shimmed processes share
// one host.
package clock
