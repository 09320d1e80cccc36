package etcdtest

import (
	"bytes"
	"fmt"
	"os"
	"syscall"
)

// sysProcAttr puts the child in its own process group (a terminal's ^C
// goes to the test only) and has the kernel kill it if the test dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// stopped reports whether every thread of process pid is stopped (state
// T in /proc), as they are some time after SIGSTOP is sent: the signal
// is delivered to each thread asynchronously.
func stopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			return false
		}
		// "pid (comm) state ...": comm may contain spaces and parentheses.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 || i+2 >= len(stat) || (stat[i+2] != 'T' && stat[i+2] != 't') {
			return false
		}
	}
	return true
}
