package filelock

import (
	"context"
	"errors"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// lockFile waits for a flock held through another open file description (as
// another process would hold it) only as long as its context allows.
func TestLockFileHonoursContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.flock")
	fd, err := syscall.Open(path, syscall.O_RDWR|syscall.O_CREAT|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(fd, syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := lockFile(ctx, path); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("lockFile on a held flock = %v, want DeadlineExceeded", err)
	}
	syscall.Close(fd) // drops the flock
	fl, err := lockFile(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	fl.Close()
	semaphores.mu.Lock()
	n := len(semaphores.m)
	semaphores.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d semaphores left", n)
	}
}
