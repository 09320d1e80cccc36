package main

import (
	"context"
	"os"
	"testing"
	"time"
)

// The test binary doubles as the worker executable (startWorker runs
// os.Executable() "worker" ...).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		if os.Getenv("DLOCK_SAFETY_TEST_WORKER_EXIT") != "" {
			os.Stderr.WriteString("worker: told to fail\n")
			os.Exit(3) // a worker that crashes (regress_workerexit_test.go)
		}
		os.Exit(runWorker(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "orphan-parent" {
		orphanParent() // regress_orphan_test.go
	}
	os.Exit(m.Run())
}

// A pause request that timed out (the worker was not getting the lock)
// stayed pending: the worker stopped itself at its next critical section,
// later, unrecorded, and no one ever resumed it (an uncounted fault, and
// the case then waited 30 s past its end to kill it).
func TestRegressPauseRequestExpires(t *testing.T) {
	ctx := context.Background()
	lockDir := t.TempDir()
	lk := holdRegisterLock(t, lockDir)
	h := &tb{root: t.TempDir()}
	defer h.close()
	dir := t.TempDir()
	c := caseSpec{backend: "file", fault: "client-pause", ttl: 500 * time.Millisecond, dur: 6 * time.Second}
	w := startWorker(h, dir, "file:"+lockDir, 0, c, c.dur, 1)
	waitWorkerStarted(t, dir, 0) // and failed an acquisition: the test holds the lock
	if len(pauseInCriticalSection([]*proc{w}, 300*time.Millisecond)) > 0 {
		t.Fatal("the worker paused in a critical section while the test held the lock")
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if stopped(w.cmd.Process.Pid) {
			t.Fatal("the worker stopped itself after its pause request had timed out: an unrecorded pause no one resumes")
		}
		select {
		case <-w.done:
			t.Fatal("the worker exited early")
		default:
		}
	}
}
