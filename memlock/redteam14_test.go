package memlock_test

import (
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/memlock"
)

// Red-team attacks on memlock's modes that held up (dlocktest.ModesEdges):
// hierarchical keys in different modes, List's mode/limit/holders, limit
// edge cases, writer preference on a key that just drained.
func TestRedTeam14_ModesEdges(t *testing.T) {
	l := memlock.New()
	dlocktest.ModesEdges(t, dlocktest.Harness{
		New:    func(testing.TB) dlock.Locker { return l },
		Expire: func(_ testing.TB, key string) { l.Expire(key) },
	})
}
