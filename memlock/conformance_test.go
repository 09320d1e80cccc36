package memlock_test

import (
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/memlock"
)

func TestMain(m *testing.M) { testserver.Main(m) }

func TestConformance(t *testing.T) {
	l := memlock.New()
	dlocktest.TestLocker(t, dlocktest.Harness{
		New:    func(testing.TB) dlock.Locker { return l },
		Expire: func(_ testing.TB, key string) { l.Expire(key) },
		// Break closes the broken holders' Lost() before it returns.
		TellsBroken: true,
	})
}

// The mode edge cases of dlocktest.ModesEdges hold: hierarchical keys in
// different modes, List's mode/limit/holders, limit edge cases, writer
// preference on a key that just drained.
func TestConformance_ModesEdges(t *testing.T) {
	l := memlock.New()
	dlocktest.ModesEdges(t, dlocktest.Harness{
		New:    func(testing.TB) dlock.Locker { return l },
		Expire: func(_ testing.TB, key string) { l.Expire(key) },
	})
}
