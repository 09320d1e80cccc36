//go:build !linux

package testserver

import "syscall"

// serverProcAttr puts a server in its own process group (a terminal's ^C
// goes to the test only). Outside Linux there is no parent-death signal.
func serverProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
