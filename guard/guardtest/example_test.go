package guardtest_test

import (
	"testing"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/guard"
	"github.com/dlock-go/dlock/guard/guardtest"
)

// Every guard runs the suite: the admission rule, shared fences, fenced
// reads, names and resources that must not collide, concurrency and bad
// input. Shared adds a second guard instance on the same store.
func ExampleRun() {
	_ = func(t *testing.T) {
		guardtest.Run(t, func(t *testing.T, opts ...driver.Option) guard.Guard {
			return guard.NewMemory(opts...)
		})
	}
}
