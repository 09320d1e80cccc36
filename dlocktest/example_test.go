package dlocktest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

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

// A deadline check in a backend's own test: the call must return by its
// context's deadline, give or take OverrunBound, and the time this test
// process was not running at all (a starved machine) is not the call's.
func ExampleStallMeter() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	deadline, _ := ctx.Deadline()
	m := dlocktest.StartStallMeter(deadline)
	<-ctx.Done() // the call under test, returning at its context's end
	end := time.Now()
	stalled := m.StopAt(end)
	fmt.Println(dlocktest.Overrun(deadline, end, stalled) <= dlocktest.OverrunBound)
	// Output: true
}
