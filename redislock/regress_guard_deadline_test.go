package redislock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// Every Guard call returns by its context's deadline on a stalled link,
// even with a default go-redis client (no ContextTimeoutEnabled), which
// would otherwise wait for its own read timeout and retries. (Red-team
// reproducer RT3-R3: Set (now Put) and Highest took about 5s with a 200ms context.)
func TestRegressGuardReturnsByDeadlineOnStalledLink(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	p := testserver.StartProxy(t, srv.Addr())
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), Password: srv.Password()})
	t.Cleanup(func() { c.Close() })
	t.Cleanup(p.Heal) // runs before c.Close: abandoned calls finish
	g := redislock.NewGuard(c)
	f := dlock.Fence{Token: 5, Owner: "me"}
	if err := g.Put(dlocktest.Context(t), "res", f, "x", "1"); err != nil {
		t.Fatal(err)
	}
	p.Stall()
	const (
		budget = 200 * time.Millisecond
		slack  = 2 * time.Second // generous: only a wait for the client's own timeouts fails
	)
	for _, tc := range []struct {
		name string
		fn   func(ctx context.Context) error
	}{
		{"Eval", func(ctx context.Context) error { _, err := g.Eval(ctx, "res", f, "return 1", nil); return err }},
		{"Put", func(ctx context.Context) error { return g.Put(ctx, "res", f, "x", "2") }},
		{"Get", func(ctx context.Context) error { _, _, err := g.Get(ctx, "res", f, "x"); return err }},
		{"IncrBy", func(ctx context.Context) error { _, err := g.IncrBy(ctx, "res", f, "n", 1); return err }},
		{"Highest", func(ctx context.Context) error { _, err := g.Highest(ctx, "res"); return err }},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		start := time.Now()
		err := tc.fn(ctx)
		took := time.Since(start)
		cancel()
		if took > budget+slack {
			t.Errorf("Guard.%s with a %v context on a stalled link returned after %v", tc.name, budget, took.Round(time.Millisecond))
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Guard.%s on a stalled link = %v, want an error wrapping context.DeadlineExceeded", tc.name, err)
		}
	}
}
