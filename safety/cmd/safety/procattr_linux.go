package main

import "syscall"

// childProcAttr has the kernel kill a child (a worker, a shimmed
// redis-server) if the harness dies: a harness killed mid-case (a
// timeout, ^C on go run) must not leave workers, a stopped one forever,
// or servers running. The children do not outlive the harness's
// threads: Go does not end a thread that has no LockOSThread goroutine.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
