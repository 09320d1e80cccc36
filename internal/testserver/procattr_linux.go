package testserver

import (
	"os"
	"runtime"
	"syscall"
)

// serverProcAttr puts a server in its own process group (a terminal's ^C
// goes to the test only) and has the kernel kill it if the process that
// started it dies, so a killed test or harness leaves no server behind.
func serverProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// StopSelf stops this process (every thread) with SIGSTOP, as a long GC
// pause or a stalled VM would, and returns once something continues it
// (SIGCONT). The signal is sent to the calling thread (tgkill), not to the
// process: a process-directed SIGSTOP may be taken by another thread, and
// until that one runs and stops the rest, the caller goes on with its next
// statements (seen on a loaded host: a "paused" process finished the write
// its pause was meant to delay). The calling thread takes a
// thread-directed one on its way out of the system call.
func StopSelf() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_ = syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
}
