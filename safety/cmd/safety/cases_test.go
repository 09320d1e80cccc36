package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/filelock"
)

// A pause lands on whichever asked worker reaches its critical section,
// and the worker that never gets the lock is not stopped later. (One
// worker chosen at random could wait behind the others past the
// deadline on a loaded machine, and a short case then had no pause: the
// negative control read as blind.)
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
