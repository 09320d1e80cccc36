package main

import (
	"os"
	"strconv"
	"syscall"
	"testing"
)

// Every thread of the harness runs at nice 0 after normalPriority, so the
// workers and servers it starts do too. (Run by make test at nice 10
// beside tests at 0, a file case's workers took 5 to 36 locks in 10 s,
// too few for a pause to show a violation.)
func TestNormalPriority_SetsEveryThreadToNiceZero(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("lowering a niceness needs root")
	}
	tasks := func() []int {
		ds, err := os.ReadDir("/proc/self/task")
		if err != nil {
			t.Fatal(err)
		}
		var tids []int
		for _, d := range ds {
			if tid, err := strconv.Atoi(d.Name()); err == nil {
				tids = append(tids, tid)
			}
		}
		return tids
	}
	for _, tid := range tasks() {
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, tid, 10); err != nil {
			t.Fatal(err)
		}
	}
	defer normalPriority()
	if left := normalPriority(); left != 0 {
		t.Fatalf("normalPriority left nice %d", left)
	}
	for _, tid := range tasks() {
		if n, err := threadNice(tid); err == nil && n != 0 {
			t.Errorf("thread %d at nice %d", tid, n)
		}
	}
}
