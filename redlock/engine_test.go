package redlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/redlock"
)

// dlock.WithObserver given to New among redlock's own options reaches the
// engine: the Locker reports its events, under the backend name "redlock".
func TestObserverThroughNew(t *testing.T) {
	c := startNodes(t, 3)
	var r dlocktest.Recorder
	l := c.locker(t, redlock.WithNodeTimeout(time.Second), dlock.WithObserver(&r))
	ctx := dlocktest.Context(t)
	lk, err := l.Acquire(ctx, dlocktest.Key(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, k := range []dlock.EventKind{dlock.EventWait, dlock.EventAttempt, dlock.EventAcquire, dlock.EventRelease} {
		e, ok := r.Last(k)
		if !ok {
			t.Fatalf("no %v event; got %+v", k, r.Events())
		}
		if e.Backend != "redlock" {
			t.Fatalf("%v event from backend %q, want \"redlock\"", k, e.Backend)
		}
	}
	if e, _ := r.Last(dlock.EventAcquire); e.Result != dlock.ResultAcquired || e.Token != lk.Token() {
		t.Fatalf("acquire event %+v, want acquired with token %d", e, lk.Token())
	}
}

// Shared and counted locks are not offered: the engine refuses them,
// naming the mode, before any node is asked.
func TestModesUnsupported(t *testing.T) {
	c := startNodes(t, 3)
	l := c.locker(t)
	key := dlocktest.Key(t)
	for _, opt := range []dlock.Option{dlock.WithShared(), dlock.WithLimit(2)} {
		_, err := l.TryAcquire(dlocktest.Context(t), key, opt)
		if !errors.Is(err, dlock.ErrUnsupported) || !strings.Contains(err.Error(), "redlock") {
			t.Fatalf("TryAcquire with a mode redlock lacks: %v, want ErrUnsupported naming the backend", err)
		}
	}
	for i, h := range c.holders(t, key) {
		if h != "" {
			t.Fatalf("node %d holds %q after refused attempts", i, h)
		}
	}
}

// A Locker built from bad input fails every call with that error, also
// with a nil context (the construction error comes first).
func TestFailedLockerReportsConstructionError(t *testing.T) {
	l := redlock.New(nil, redlock.WithPrefix("x"))
	var nilCtx context.Context
	if _, err := l.List(nilCtx, ""); !errors.Is(err, dlock.ErrNilClient) {
		t.Fatalf("List on a Locker without clients: %v, want ErrNilClient", err)
	}
	if _, err := l.TryAcquire(context.Background(), "k"); !errors.Is(err, dlock.ErrNilClient) {
		t.Fatalf("TryAcquire on a Locker without clients: %v, want ErrNilClient", err)
	}
}
