package testserver

import "syscall"

// serverProcAttr puts a server in its own process group (a terminal's ^C
// goes to the test only) and has the kernel kill it if the process that
// started it dies, so a killed test or harness leaves no server behind.
func serverProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
