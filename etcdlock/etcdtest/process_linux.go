package etcdtest

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
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

// openConns counts the TCP connections (IPv4 and IPv6) from or to one of
// ports that a process still holds open (established, or closed by the
// other end only), from /proc/net/tcp{,6}; -1 if they cannot be read.
func openConns(ports map[int]bool) int {
	n, read := 0, false
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		read = true
		for _, line := range bytes.Split(data, []byte("\n"))[1:] {
			// "sl local_address rem_address st ...", addresses as
			// hex "ADDR:PORT", the state in hex: 01 established,
			// 08 close-wait.
			fields := bytes.Fields(line)
			if len(fields) < 4 || (string(fields[3]) != "01" && string(fields[3]) != "08") {
				continue
			}
			if ports[hexPort(fields[1])] || ports[hexPort(fields[2])] {
				n++
			}
		}
	}
	if !read {
		return -1
	}
	return n
}

// hexPort is the port of a /proc/net/tcp address "ADDR:PORT" (hex).
func hexPort(addr []byte) int {
	i := bytes.LastIndexByte(addr, ':')
	if i < 0 {
		return -1
	}
	p, err := strconv.ParseUint(string(addr[i+1:]), 16, 16)
	if err != nil {
		return -1
	}
	return int(p)
}
