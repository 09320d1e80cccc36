//go:build !linux

package testserver

import (
	"os"
	"syscall"
	"time"
)

// serverProcAttr puts a server in its own process group (a terminal's ^C
// goes to the test only). Outside Linux there is no parent-death signal.
func serverProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// StopSelf stops this process with SIGSTOP and returns once something
// continues it. Outside Linux the signal is process-directed.
func StopSelf() { _ = syscall.Kill(os.Getpid(), syscall.SIGSTOP) }

// waitStopped cannot tell when a stop took effect here: it returns at once.
func waitStopped(pid int, d time.Duration) error { return nil }
