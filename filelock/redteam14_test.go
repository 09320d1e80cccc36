package filelock_test

import (
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
)

// Red-team attacks on filelock's modes that held up: hierarchical keys in
// different modes, List's mode/limit/holders, limit edge cases (limit 1
// against exclusive, MaxLimit, a mismatch against expired holders), the
// same owner retried, and writer preference on a key that just drained.
func TestRedTeam14_ModesEdges(t *testing.T) {
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
