//go:build !linux

package etcdtest

import "syscall"

// sysProcAttr puts the child in its own process group. Without Linux's
// parent-death signal, a child whose test died ends when its stdin (held
// by the test) closes.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// stopped cannot tell here: Pause returns once SIGSTOP is sent.
func stopped(int) bool { return true }

// openConns cannot tell here: -1.
func openConns(map[int]bool) int { return -1 }
