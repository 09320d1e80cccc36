package etcdlock_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/etcdlock/etcdtest"
	"github.com/dlock-go/dlock/internal/testserver"
)

// Every Guard call returns by its context's deadline on a stalled link
// (clientv3 puts the context's deadline on the gRPC call). Checked
// alongside the Redis guard's fix for red-team RT3-R3.
func TestRegressGuardReturnsByDeadlineOnStalledLink(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	u, err := url.Parse(c.Members[0].ClientURL)
	if err != nil {
		t.Fatal(err)
	}
	p := testserver.StartProxy(t, u.Host)
	g := etcdlock.NewGuard(newClient(t, []string{"http://" + p.Addr()}), etcdlock.WithGuardPrefix("/guard/"))
	t.Cleanup(p.Heal)
	f := dlock.Fence{Token: 5, Owner: "me"}
	if err := g.Put(dlocktest.Context(t), "res", f, "/data/x", "1"); err != nil {
		t.Fatal(err)
	}
	p.Stall()
	const (
		budget = 200 * time.Millisecond
		slack  = 2 * time.Second // generous: only a wait for some other timeout fails
	)
	for _, tc := range []struct {
		name string
		fn   func(ctx context.Context) error
	}{
		{"Txn", func(ctx context.Context) error {
			_, err := g.Txn(ctx, "res", f, clientv3.OpPut("/data/x", "2"))
			return err
		}},
		{"Put", func(ctx context.Context) error { return g.Put(ctx, "res", f, "/data/x", "2") }},
		{"Get", func(ctx context.Context) error { _, _, err := g.Get(ctx, "res", f, "/data/x"); return err }},
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
