package filelock_test

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/filelock"
)

func TestConformance(t *testing.T) {
	dir := t.TempDir()
	ops := mustNew(t, dir)
	dlocktest.TestLocker(t, dlocktest.Harness{
		New: func(t testing.TB) dlock.Locker { return mustNew(t, dir) },
		Expire: func(t testing.TB, key string) {
			if err := ops.Expire(key); err != nil {
				t.Fatalf("Expire(%q): %v", key, err)
			}
		},
		// A lock held past breakListenDelay watches its record.
		NoticesDeletion: true,
		TellsBroken:     true,
		// No network: the fault section's "server" is the record lock,
		// held by a stopped process.
		Faults: &dlocktest.Faults{
			Pause: func(t testing.TB, keys ...string) func() { return pauseKeys(t, dir, keys...) },
		},
	})
}

// The conformance suite again with inotify off and a short poll: waiters
// are woken in-process or by polling only.
func TestConformanceWithoutInotify(t *testing.T) {
	dir := t.TempDir()
	ops := mustNew(t, dir)
	dlocktest.TestLocker(t, dlocktest.Harness{
		New: func(t testing.TB) dlock.Locker {
			return mustNew(t, dir, filelock.WithInotify(false), filelock.WithPollInterval(20*time.Millisecond))
		},
		Expire: func(t testing.TB, key string) {
			if err := ops.Expire(key); err != nil {
				t.Fatalf("Expire(%q): %v", key, err)
			}
		},
		Contenders:  8,
		TellsBroken: true, // through this process's wake-ups, without inotify
	})
}

// The mode edge cases of dlocktest.ModesEdges hold: hierarchical keys in
// different modes, List's mode/limit/holders, limit edge cases (limit 1
// against exclusive, MaxLimit, a mismatch against expired holders), the
// same owner retried, and writer preference on a key that just drained.
func TestConformance_ModesEdges(t *testing.T) {
	l := mustNew(t, t.TempDir())
	dlocktest.ModesEdges(t, dlocktest.Harness{
		New: func(testing.TB) dlock.Locker { return l },
		Expire: func(t testing.TB, key string) {
			if err := l.Expire(key); err != nil {
				t.Fatal(err)
			}
		},
	})
}
