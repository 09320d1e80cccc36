package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER from <linux/prctl.h>.
const prSetChildSubreaper = 36

// setSubreaper makes the calling process a child subreaper: orphaned
// descendants are re-parented to it instead of to init, so it can still
// find (and reap) them.
func setSubreaper() error {
	if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); e != 0 {
		return e
	}
	return nil
}

// cmdSysProcAttr starts CMD in a new process group, in the terminal's
// foreground when tty >= 0, and has the kernel SIGKILL it if the thread
// that started it dies (second line of defence, if the supervisor itself
// is SIGKILLed).
func cmdSysProcAttr(tty int) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Foreground: tty >= 0, Ctty: tty}
}

// procStat returns the parent pid and state letter of pid from
// /proc/PID/stat.
// zombie reports whether pid has exited and awaits its parent's wait.
func zombie(pid int) bool {
	_, state, ok := procStat(pid)
	return ok && state == 'Z'
}

func procStat(pid int) (ppid int, state byte, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // comm may hold spaces and ')'
	if i < 0 || i+2 >= len(s) {
		return 0, 0, false
	}
	f := strings.Fields(s[i+2:]) // state ppid pgrp ...
	if len(f) < 2 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(f[1])
	if err != nil {
		return 0, 0, false
	}
	return ppid, f[0][0], true
}

// descendants returns every live (not zombie) process below root, found
// by following parent links in /proc. It is a snapshot: callers that kill
// what it finds repeat until it comes back empty.
func descendants(root int) []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	children := make(map[int][]int)
	zombie := make(map[int]bool)
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		ppid, state, ok := procStat(pid)
		if !ok {
			continue
		}
		children[ppid] = append(children[ppid], pid)
		zombie[pid] = state == 'Z'
	}
	var out []int
	queue := []int{root}
	seen := map[int]bool{root: true}
	for len(queue) > 0 && len(seen) <= len(names)+1 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			if seen[c] {
				continue
			}
			seen[c] = true
			queue = append(queue, c)
			if !zombie[c] {
				out = append(out, c)
			}
		}
	}
	return out
}

// foregroundTTY opens the controlling terminal when process group job
// (dlock's) is its foreground group, and returns -1 otherwise (no
// terminal, or started in the background).
func foregroundTTY(job int) int {
	fd, err := syscall.Open("/dev/tty", syscall.O_RDWR|syscall.O_CLOEXEC|syscall.O_NOCTTY, 0)
	if err != nil {
		return -1
	}
	if pg, err := tcgetpgrp(fd); err != nil || pg != job {
		syscall.Close(fd)
		return -1
	}
	return fd
}

func tcgetpgrp(fd int) (int, error) {
	var pg int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TIOCGPGRP, uintptr(unsafe.Pointer(&pg))); e != 0 {
		return 0, e
	}
	return int(pg), nil
}

// tcsetpgrp makes pgid the terminal's foreground group. A caller in a
// background group must ignore SIGTTOU first.
func tcsetpgrp(fd, pgid int) error {
	pg := int32(pgid)
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TIOCSPGRP, uintptr(unsafe.Pointer(&pg))); e != 0 {
		return e
	}
	return nil
}

// leaseClock reads the clock on which dlock tells its supervisor the lease
// deadline: one clock for every process of the system (so a deadline
// crosses the pipe as a point in time, however late it is read), monotonic,
// and counting time suspended (CLOCK_BOOTTIME), as the lease on the
// server does.
func leaseClock() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		panic("clock_gettime(CLOCK_BOOTTIME): " + err.Error()) // Linux has had it since 2.6.39
	}
	return ts.Nano()
}
