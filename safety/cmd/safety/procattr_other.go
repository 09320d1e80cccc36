//go:build !linux

package main

import (
	"os"
	"syscall"
)

// childProcAttr: outside Linux there is no parent-death signal.
func childProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }

// stopSelf: outside Linux, a process-directed SIGSTOP.
func stopSelf() { _ = syscall.Kill(os.Getpid(), syscall.SIGSTOP) }
