//go:build !linux

package main

import (
	"errors"
	"syscall"
)

// Outside Linux there is no subreaper, no /proc and no parent-death
// signal: CMD still runs in its own process group, which is killed, but a
// descendant that leaves the group can outlive dlock (and its lease).

func setSubreaper() error { return errors.New("child subreaper: Linux only") }

func cmdSysProcAttr(int) *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

func descendants(int) []int { return nil }

func foregroundTTY() int { return -1 }

func tcgetpgrp(int) (int, error) { return 0, errors.ErrUnsupported }

func tcsetpgrp(int, int) error { return errors.ErrUnsupported }
