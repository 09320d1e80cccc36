//go:build !linux

package main

import "syscall"

// childProcAttr: outside Linux there is no parent-death signal.
func childProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }
