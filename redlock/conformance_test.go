package redlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/redlock"
)

// conformanceNodeTimeout is the node timeout of the conformance suite's
// Lockers. The default (TTL/20, at least 50ms) is a budget for a node's
// answer that a race-enabled test process, beside other packages' tests
// on 2 cores, can miss; the suite is about semantics, and the node
// timeout's own tests use the default.
const conformanceNodeTimeout = time.Second

// conformanceTTL is the suite's short lease (Harness.TTL): twice its
// default, so that a holder starved of CPU for a moment (several modules'
// race-enabled tests at once on 2 cores) still renews in time; a renewal
// is due every TTL/3 and a lock is lost when none succeeded within the
// TTL. Symptom: HeldPast3TTL lost a 1s lease at its deadline on a
// loaded machine.
const conformanceTTL = 2 * time.Second

// conformanceGrace makes Release wait for every node's answer (each
// bounded by the node timeout) instead of a grace of a few times what the
// majority took, which a loaded machine can miss: the suite's "a break
// right after Release removes nothing" is about what Release settles, not
// how long the grace is (tested on its own in this package).
func conformanceGrace(t *testing.T) { redlock.SetEndlessGrace(t) }

func TestConformance(t *testing.T) {
	conformanceGrace(t)
	c := startNodes(t, 5)
	dlocktest.TestLocker(t, dlocktest.Harness{
		TTL:         conformanceTTL,
		TellsBroken: true, // each node publishes the break
		New:         func(t testing.TB) dlock.Locker { return c.locker(t, redlock.WithNodeTimeout(conformanceNodeTimeout)) },
		Expire: func(t testing.TB, key string) {
			for _, a := range c.admin {
				if err := a.Del(context.Background(), lockKey(key)).Err(); err != nil {
					t.Fatal(err)
				}
			}
		},
	})
}
