package redlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/redlock"
)

func TestBadInput(t *testing.T) {
	c := startNodes(t, 3)
	ctx := dlocktest.Context(t)
	a := c.client(t, c.srvs[0])
	cases := []struct {
		l    *redlock.Locker
		want error
	}{
		{redlock.New(nil), dlock.ErrNilClient},
		{redlock.New([]redis.UniversalClient{a, nil}), dlock.ErrNilClient},
		{redlock.New([]redis.UniversalClient{a, (*redis.Client)(nil)}), dlock.ErrNilClient},
		{redlock.New([]redis.UniversalClient{a, a}), dlock.ErrInvalidOption},
		{redlock.New([]redis.UniversalClient{a}, redlock.WithNodeTimeout(-1)), dlock.ErrInvalidOption},
	}
	for i, tc := range cases {
		if _, err := tc.l.Acquire(ctx, "k"); !errors.Is(err, tc.want) {
			t.Errorf("case %d Acquire: %v, want %v", i, err, tc.want)
		}
		if _, err := tc.l.List(ctx, ""); !errors.Is(err, tc.want) {
			t.Errorf("case %d List: %v, want %v", i, err, tc.want)
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

// wrappedClient is a client wrapper passed by value that Go cannot compare
// (it has a slice field), as an application may write to add behaviour
// around a *redis.Client.
type wrappedClient struct {
	*redis.Client
	tags []string
}

// New never panics on its clients: a client of a type that cannot be a
// map key is accepted, and a comparable client listed twice is still
// refused.
// Symptom: New's duplicate check panicked with "hash of unhashable type".
func TestNew_AcceptsUncomparableClients(t *testing.T) {
	var cls []redis.UniversalClient
	for range 3 {
		c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
		t.Cleanup(func() { c.Close() })
		cls = append(cls, wrappedClient{Client: c, tags: []string{"x"}})
	}
	var l *redlock.Locker
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("redlock.New panicked: %v", r)
			}
		}()
		l = redlock.New(cls)
	}()
	if l.Quorum() != 2 {
		t.Fatalf("Quorum = %d, want 2", l.Quorum())
	}
	// The mode check comes before any I/O to the (unreachable) nodes.
	if _, err := l.TryAcquire(context.Background(), "k", dlock.WithShared()); !errors.Is(err, dlock.ErrUnsupported) {
		t.Fatalf("TryAcquire(WithShared) = %v, want ErrUnsupported", err)
	}
	// The same comparable client twice is still refused.
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { c.Close() })
	if _, err := redlock.New([]redis.UniversalClient{c, cls[0], c}).TryAcquire(context.Background(), "k"); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Fatalf("a client listed twice: %v, want ErrInvalidOption", err)
	}
}

// Quorum on the zero Locker, or on one New refused, does not panic.
// Symptom: Quorum on the zero Locker panicked.
func TestQuorum_ZeroAndFailedLockersDoNotPanic(t *testing.T) {
	var zero redlock.Locker
	if q := zero.Quorum(); q != 0 {
		t.Fatalf("zero Locker quorum %d", q)
	}
	_ = redlock.New(nil).Quorum() // must not panic
}

// Every entry point taking a context reports a nil one as an error
// wrapping dlock.ErrInvalidOption.
// Symptom: List passed a nil context to one goroutine per node, whose panic crashed the process.
func TestLocker_NilContextIsInvalidOption(t *testing.T) {
	c := startNodes(t, 3)
	l := c.locker(t)
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	var nilCtx context.Context
	for _, tc := range []struct {
		name string
		fn   func() error
	}{
		{"Locker.List", func() error { _, err := l.List(nilCtx, ""); return err }},
		{"Locker.Acquire", func() error { _, err := l.Acquire(nilCtx, key+"x"); return err }},
		{"Locker.TryAcquire", func() error { _, err := l.TryAcquire(nilCtx, key+"x"); return err }},
		{"Lock.Refresh", func() error { return lk.Refresh(nilCtx) }},
		{"dlock.Do", func() error {
			return dlock.Do(nilCtx, l, key+"y", func(context.Context, *dlock.Lock) error { return nil })
		}},
	} {
		if err := tc.fn(); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("%s(nil ctx) = %v, want an error wrapping dlock.ErrInvalidOption", tc.name, err)
		}
	}
}

// Every call of a nil *Locker is an error wrapping dlock.ErrNilClient.
// Symptom: Acquire and TryAcquire of a nil *Locker panicked.
func TestNilLocker_EveryCallIsErrNilClient(t *testing.T) {
	dlocktest.TestNilLocker(t, (*redlock.Locker)(nil))
}

// Another backend's option is refused, not silently ignored.
// Symptom: etcdlock.New(c, zklock.WithPrefix("/app")) locked without the prefix.
func TestNew_RefusesAnotherBackendsOption(t *testing.T) {
	c := startNodes(t, 3)
	dlocktest.TestRefusesForeignOption(t, c.locker(t, dlocktest.ForeignOption()))
}
