package main

import (
	"os"
	"runtime"
	"syscall"
)

// childProcAttr has the kernel kill a child (a worker, a shimmed
// redis-server) if the harness dies: a harness killed mid-case (a
// timeout, ^C on go run) must not leave workers, a stopped one forever,
// or servers running. The children do not outlive the harness's
// threads: Go does not end a thread that has no LockOSThread goroutine.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// stopSelf stops the worker (every thread) with SIGSTOP sent to the
// calling thread: a process-directed SIGSTOP may be taken by another
// thread, and until that one runs and stops the rest the caller goes on
// with its next statements (seen on a loaded host by the examples'
// harness: a paused process finished its write first). The calling
// thread takes a thread-directed one on its way out of the system call.
func stopSelf() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_ = syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
}
