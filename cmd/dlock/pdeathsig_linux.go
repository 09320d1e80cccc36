package main

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal makes the kernel SIGKILL the child when dlock dies.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
