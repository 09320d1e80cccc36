package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/pglock"
)

// The read-first acquire statement under racing contenders (several
// goroutines on each of several Lockers, direct and through PgBouncer):
// fresh keys each round, so first inserts race; then each key is
// released and taken over by the racing rest. Never two holders at once,
// and a key's tokens increase in the order it is granted.
func TestRedTeam_AcquireRace(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	pb := bouncerFor(t, pg)
	for _, tc := range []struct{ name, dsn string }{{"direct", pg.DSN("")}, {"pgbouncer", pb.DSN("")}} {
		t.Run(tc.name, func(t *testing.T) {
			var lockers []*pglock.Locker
			for i := 0; i < 4; i++ {
				lockers = append(lockers, pglock.New(newPool(t, tc.dsn)))
			}
			var granted atomic.Int64
			for round := 0; round < 4; round++ {
				ctx := dlocktest.Context(t)
				keys := []string{dlocktest.Key(t) + fmt.Sprint(round, "a"), dlocktest.Key(t) + fmt.Sprint(round, "b")}
				type keyState struct {
					mu     sync.Mutex
					held   bool
					last   uint64
					grants int
				}
				st := map[string]*keyState{}
				for _, k := range keys {
					st[k] = &keyState{}
				}
				var wg sync.WaitGroup
				for li, l := range lockers {
					for g := 0; g < 4; g++ {
						wg.Add(1)
						go func() {
							defer wg.Done()
							for i := 0; i < 3; i++ {
								k := keys[(li+g+i)%len(keys)]
								var lk *dlock.Lock
								var err error
								if (g+i)%2 == 0 {
									lk, err = l.Acquire(ctx, k, dlock.WithBackoff(dlock.ConstBackoff{Delay: 5 * time.Millisecond}))
								} else {
									lk, err = l.TryAcquire(ctx, k)
									if errors.Is(err, dlock.ErrNotAcquired) {
										continue
									}
								}
								if err != nil {
									t.Errorf("acquire %s: %v", k, err)
									return
								}
								s := st[k]
								s.mu.Lock()
								if s.held {
									t.Errorf("%s granted (token %d) while held", k, lk.Token())
								}
								if lk.Token() <= s.last {
									t.Errorf("%s: token %d granted after token %d", k, lk.Token(), s.last)
								}
								s.held, s.last = true, lk.Token()
								s.grants++
								s.mu.Unlock()
								granted.Add(1)
								time.Sleep(time.Millisecond)
								s.mu.Lock()
								s.held = false
								s.mu.Unlock()
								if err := lk.Release(ctx); err != nil {
									t.Errorf("release %s: %v", k, err)
									return
								}
							}
						}()
					}
				}
				wg.Wait()
				if t.Failed() {
					return
				}
			}
			t.Logf("%d grants", granted.Load())
		})
	}
	_ = context.Background
}
