package dlockprom_test

import (
	"context"
	"fmt"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockprom"
	"github.com/dlock-go/dlock/memlock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Three lines add metrics to any backend: a Registerer (usually
// prometheus.DefaultRegisterer), the Observer, and WithObserver.
func Example() {
	reg := prometheus.NewRegistry()
	obs, err := dlockprom.New(reg)
	if err != nil {
		panic(err)
	}
	locker := memlock.New(dlock.WithObserver(obs))

	ctx := context.Background()
	lk, _ := locker.TryAcquire(ctx, "report")
	_, err = locker.TryAcquire(ctx, "report") // contended
	lk.Release(ctx)

	n, _ := testutil.GatherAndCount(reg, "dlock_acquire_total")
	fmt.Println(err != nil, n)
	// Output: true 2
}
