//go:build !linux

package main

import "os/exec"

// setParentDeathSignal is a no-op where the OS has no parent-death signal:
// there a child can outlive a killed dlock (and its lease).
func setParentDeathSignal(*exec.Cmd) {}
