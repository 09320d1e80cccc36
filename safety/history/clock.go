package history

import "golang.org/x/sys/unix"

// Now is the host's CLOCK_MONOTONIC in nanoseconds: comparable between
// processes on one host, unaffected by wall-clock jumps.
func Now() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("CLOCK_MONOTONIC: " + err.Error()) // cannot fail on Linux
	}
	return ts.Nano()
}
