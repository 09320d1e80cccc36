/* Test probe for the clock shim: for every line read on stdin, prints one
 * line "realtime_ns realtime_coarse_ns gettimeofday_us time_s monotonic_ns
 * tod_null_rc", each read through libc (so through the shim when it is
 * preloaded). Exits at EOF. */
#include <stdio.h>
#include <sys/time.h>
#include <time.h>

static long long ns(struct timespec ts) { return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec; }

int main(void) {
	char line[64];
	while (fgets(line, sizeof line, stdin) != NULL) {
		struct timespec rt, coarse, mono;
		struct timeval tv;
		clock_gettime(CLOCK_REALTIME, &rt);
		clock_gettime(CLOCK_REALTIME_COARSE, &coarse);
		gettimeofday(&tv, NULL);
		time_t t = time(NULL);
		clock_gettime(CLOCK_MONOTONIC, &mono);
		/* a NULL tv is legal; the shim must not dereference it */
		struct timeval *volatile nullp = NULL;
		int null_rc = gettimeofday(nullp, NULL);
		if (tv.tv_usec < 0 || tv.tv_usec >= 1000000 || rt.tv_nsec < 0 || rt.tv_nsec >= 1000000000)
			printf("denormal\n");
		printf("%lld %lld %lld %lld %lld %d\n", ns(rt), ns(coarse),
		       (long long)tv.tv_sec * 1000000LL + tv.tv_usec, (long long)t, ns(mono), null_rc);
		fflush(stdout);
	}
	return 0;
}
