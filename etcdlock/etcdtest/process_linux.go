package etcdtest

import "syscall"

// sysProcAttr puts the child in its own process group (a terminal's ^C
// goes to the test only) and has the kernel kill it if the test dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
