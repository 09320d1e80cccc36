package dlocktest_test

import (
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/memlock"
)

// A backend's conformance test: one Harness, the whole contract. A
// network backend also fills Harness.Faults (stalled links, a paused
// server, lost replies) with the fault proxy of internal/testserver.
func ExampleTestLocker() {
	_ = func(t *testing.T) {
		l := memlock.New() // one service; Lockers from New share it
		dlocktest.TestLocker(t, dlocktest.Harness{
			New:    func(testing.TB) dlock.Locker { return l },
			Expire: func(_ testing.TB, key string) { l.Expire(key) },
		})
	}
}
