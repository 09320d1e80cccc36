//go:build !linux

package main

import (
	"errors"
	"syscall"

	"golang.org/x/sys/unix"
)

// Outside Linux there is no subreaper, no /proc and no parent-death
// signal: CMD still runs in its own process group, which is killed, but a
// descendant that leaves the group can outlive dlock (and its lease).

func setSubreaper() error { return errors.New("child subreaper: Linux only") }

func cmdSysProcAttr(int) *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

func descendants(int) []int { return nil }

func zombie(int) bool { return false }

func foregroundTTY(int) int { return -1 }

func tcgetpgrp(int) (int, error) { return 0, errors.ErrUnsupported }

func tcsetpgrp(int, int) error { return errors.ErrUnsupported }

// leaseClock reads a monotonic clock shared by every process (see the
// Linux version; this one may not count time suspended).
func leaseClock() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("clock_gettime(CLOCK_MONOTONIC): " + err.Error())
	}
	return ts.Nano()
}
