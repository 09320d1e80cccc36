package filelock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/filelock"
)

// A break by another process reaches a holder that already listens (its
// subscription and the directory's inotify reader in place) through
// inotify, before the holder's first renewal.
// Symptom: a holder broken by another process learned of it only at its next renewal.
func TestBind_BreakByAnotherProcessReachesHolder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	dir := t.TempDir()
	l := mustNew(t, dir)
	const ttl = time.Minute // first renewal point 20s on: far past a notice
	lk, err := l.Acquire(ctx, "k", dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	for !filelock.Notified(l, "k") {
		select {
		case <-lk.Lost():
			t.Fatalf("lost before the break: %v", lk.Err())
		case <-ctx.Done():
			t.Fatal("hang: the held lock never subscribed to its key")
		case <-time.After(10 * time.Millisecond):
		}
	}
	cmd, out, errb := helper(ctx, t, envMode+"=break", envDir+"="+dir, envKey+"=k")
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	select {
	case line := <-out.lines:
		if line != "broken 1" {
			t.Fatalf("child printed %q; stderr %s", line, errb)
		}
	case <-ctx.Done():
		t.Fatalf("hang: the child's break\n%s", errb)
	}
	timer := time.NewTimer(ttl / 3)
	defer timer.Stop()
	select {
	case <-lk.Lost():
	case <-timer.C:
		t.Fatal("Lost() still open at the first renewal point: the break did not reach the holder")
	}
	var le *dlock.LostError
	if !errors.As(lk.Err(), &le) || le.Reason != dlock.LossBackend || !errors.Is(lk.Err(), dlock.ErrNotHeld) || !strings.Contains(lk.Err().Error(), `"k"`) {
		t.Errorf("Err() = %v, want a *LostError with reason %q wrapping ErrNotHeld", lk.Err(), dlock.LossBackend)
	}
}
