package main

import (
	"os"
	"strconv"
	"syscall"
)

// normalPriority sets every thread of this process to nice 0 and returns
// the niceness it could not undo (0 when it could). The harness measures
// what breaks on a timeline: its workers and servers inherit its
// priority, and at nice 10 beside tests at 0 (make test runs its steps
// so) a file case's four workers took 5 to 36 locks in 10 s instead of
// 100 to 500, too few for its pauses to show anything. A niceness is per
// thread on Linux, and a child inherits the one of the thread that
// started it, so each thread is set; threads made later inherit 0.
// Lowering a niceness needs root (CAP_SYS_NICE); without it the process
// stays as it was.
func normalPriority() int {
	// A thread started during a pass by one not yet set inherits the old
	// niceness: passes repeat until one finds every thread at 0.
	left := 0
	for range 5 {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return 0
		}
		changed := false
		left = 0
		for _, task := range tasks {
			tid, err := strconv.Atoi(task.Name())
			if err != nil {
				continue
			}
			n, err := threadNice(tid)
			if err != nil || n == 0 {
				continue // gone, or already normal
			}
			if syscall.Setpriority(syscall.PRIO_PROCESS, tid, 0) == nil {
				changed = true
			} else {
				left = max(left, n)
			}
		}
		if !changed {
			break
		}
	}
	return left
}

// threadNice is the niceness of thread tid of this process.
func threadNice(tid int) (int, error) {
	// getpriority returns 20 - nice (a raw syscall: glibc's offset is not
	// applied).
	p, err := syscall.Getpriority(syscall.PRIO_PROCESS, tid)
	if err != nil {
		return 0, err
	}
	return 20 - p, nil
}
