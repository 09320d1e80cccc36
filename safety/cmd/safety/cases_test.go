package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/filelock"
)

// A pause lands on whichever asked worker reaches its critical section,
// and the worker that never gets the lock is not stopped later. (One
// worker chosen at random could wait behind the others past the
// deadline on a loaded machine, and a short case would then have no
// pause: the negative control would read as blind.)
func TestPauseInCriticalSection_LandsOnTheWorkerThatGetsTheLock(t *testing.T) {
	ctx := context.Background()
	blockedDir, freeDir := t.TempDir(), t.TempDir()
	lk := holdRegisterLock(t, blockedDir)
	defer lk.Release(ctx)
	h := &tb{root: t.TempDir()}
	defer h.close()
	dir := t.TempDir()
	c := caseSpec{backend: "file", fault: "client-pause", ttl: 500 * time.Millisecond, dur: 8 * time.Second}
	blocked := startWorker(h, dir, "file:"+blockedDir, 0, c, c.dur, 1)
	free := startWorker(h, dir, "file:"+freeDir, 1, c, c.dur, 2)
	waitWorkerStarted(t, dir, 0)
	waitWorkerStarted(t, dir, 1)
	paused := pauseInCriticalSection([]*proc{blocked, free}, 10*time.Second)
	if len(paused) != 1 || paused[0] != free {
		t.Fatalf("paused %d workers, want exactly the one that gets its lock", len(paused))
	}
	if !stopped(free.cmd.Process.Pid) {
		t.Fatal("the paused worker is not stopped")
	}
	free.cmd.Process.Signal(syscall.SIGCONT)
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if stopped(blocked.cmd.Process.Pid) {
			blocked.cmd.Process.Signal(syscall.SIGCONT)
			t.Fatal("the worker that never got its lock stopped itself after the request was withdrawn")
		}
	}
}

// holdRegisterLock takes the workers' lock in the file lock directory dir
// for a minute, so a worker locking there never gets it.
func holdRegisterLock(t *testing.T, dir string) *dlock.Lock {
	t.Helper()
	l, err := filelock.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	lk, err := l.Acquire(context.Background(), "safety/register", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	return lk
}

// waitWorkerStarted waits until worker id of the run directory dir has
// logged its first step.
func waitWorkerStarted(t *testing.T, dir string, id int) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if st, err := os.Stat(filepath.Join(dir, fmt.Sprintf("worker-%d.log", id))); err == nil && st.Size() > 0 {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("worker %d did not start", id)
		}
	}
}

// Symptom: a timed-out pause request stopped the worker later, unrecorded, and no one resumed it.
// A pause request that timed out (the worker was not getting the lock) is
// withdrawn: the worker does not stop itself at its next critical section
// (an uncounted fault, which the case would wait 30 s past its end to
// kill).
func TestPauseInCriticalSection_TimedOutRequestIsWithdrawn(t *testing.T) {
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

// Symptom: crashed workers went unnoticed and the case reported their events as if they had run their course.
// A worker process that crashes (exit status 3 here) makes a case error
// that says how it ended: cmd.Wait's error is kept.
func TestRunCase_CrashedWorkerIsCaseError(t *testing.T) {
	t.Setenv("DLOCK_SAFETY_TEST_WORKER_EXIT", "1")
	c := caseSpec{backend: "file", fault: "none", ttl: time.Second, dur: time.Second}
	res := runCase(c, 2, 1)
	if res.err == "" {
		t.Fatal("a case whose workers all crashed has no error")
	}
	if !strings.Contains(res.err, "exit status 3") || !strings.Contains(res.err, "told to fail") {
		t.Fatalf("the case error does not say how the worker ended: %s", res.err)
	}
}

// Symptom: the matrix's Faults section listed clock-jump and kill-leader with an empty description.
// Every fault a case injects has its faultDoc entry.
func TestFaultDoc_DescribesEveryCaseFault(t *testing.T) {
	for _, c := range append(allCases(), quickCases()...) {
		if faultDoc[c.fault] == "" {
			t.Errorf("%s: fault %q has no faultDoc entry (the matrix would describe it as empty)", c.name(), c.fault)
		}
	}
}
