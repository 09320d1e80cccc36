package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/etcdlock/etcdtest"
)

// Every entry point taking a context reports a nil one as an error
// wrapping dlock.ErrInvalidOption, never a panic. (Red-team reproducer
// RT3-E1: Guard.Put and Guard.Highest panicked.)
func TestRegressNilContext(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cl := newClient(t, c.Endpoints())
	l := etcdlock.New(cl)
	g := etcdlock.NewGuard(cl, etcdlock.WithGuardPrefix("/guard/"))
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	var nilCtx context.Context
	f := lk.Fence()
	for _, tc := range []struct {
		name string
		fn   func() error
	}{
		{"Locker.Acquire", func() error { _, err := l.Acquire(nilCtx, key+"x"); return err }},
		{"Locker.TryAcquire", func() error { _, err := l.TryAcquire(nilCtx, key+"x"); return err }},
		{"Locker.List", func() error { _, err := l.List(nilCtx, ""); return err }},
		{"Lock.Refresh", func() error { return lk.Refresh(nilCtx) }},
		{"Guard.Txn", func() error { _, err := g.Txn(nilCtx, "r", f, clientv3.OpPut("/data/k", "v")); return err }},
		{"Guard.Put", func() error { return g.Put(nilCtx, "r", f, "/data/k", "v") }},
		{"Guard.Get", func() error { _, _, err := g.Get(nilCtx, "r", f, "/data/k"); return err }},
		{"Guard.Highest", func() error { _, err := g.Highest(nilCtx, "r"); return err }},
		{"nil-client Guard.Put", func() error {
			return etcdlock.NewGuard(nil, etcdlock.WithGuardPrefix("/guard/")).Put(nilCtx, "r", f, "/data/k", "v")
		}},
	} {
		err := func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("PANIC: %v", r)
				}
			}()
			return tc.fn()
		}()
		if !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("%s(nil ctx) = %v, want an error wrapping dlock.ErrInvalidOption", tc.name, err)
		}
	}
}
