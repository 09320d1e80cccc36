package dlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

// junkBackend returns whatever the test says.
type junkBackend struct {
	try   func() (driver.Grant, error)
	tries atomic.Int32
}

func (b *junkBackend) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	b.tries.Add(1)
	return b.try()
}

type okLease struct{ refreshes atomic.Int32 }

func (l *okLease) Refresh(ctx context.Context, ttl time.Duration) error {
	l.refreshes.Add(1)
	return nil
}
func (l *okLease) Release(ctx context.Context) error { return nil }

// batchJunk: RefreshBatch misbehaves in the given way.
type batchJunk struct {
	junkBackend
	mode  string
	calls atomic.Int32
}

func (b *batchJunk) RefreshBatch(ctx context.Context, rs []driver.Renewal, done func(int, error)) {
	b.calls.Add(1)
	switch b.mode {
	case "twice":
		for i := range rs {
			done(i, nil)
			done(i, errors.New("second report"))
		}
	case "range":
		done(-1, nil)
		done(len(rs), nil)
		done(1<<30, nil)
	case "never":
	case "after-return":
		go func() {
			time.Sleep(5 * time.Millisecond)
			for i := range rs {
				done(i, nil)
			}
		}()
	case "nil-ok":
		for i := range rs {
			done(i, nil)
		}
	}
}

func TestRedJunkBackend(t *testing.T) {
	t.Run("nil Lease in a successful Grant", func(t *testing.T) {
		b := &junkBackend{try: func() (driver.Grant, error) { return driver.Grant{Token: 1}, nil }}
		a := dlock.NewEngine(b)
		lk, err := a.TryAcquire(context.Background(), "k")
		t.Logf("TryAcquire: lk=%v err=%v", lk, err)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err = a.Acquire(ctx, "k")
		t.Logf("Acquire(50ms): err=%v after %d tries", err, b.tries.Load())
	})
	t.Run("zero token", func(t *testing.T) {
		b := &junkBackend{try: func() (driver.Grant, error) { return driver.Grant{Lease: &okLease{}}, nil }}
		a := dlock.NewEngine(b)
		lk, err := a.TryAcquire(context.Background(), "k")
		if err == nil {
			t.Logf("a grant with token 0 is handed out: Token()=%d; a fresh guard admits it? %v", lk.Token(), dlock.FenceRecord{}.Admits(lk.Fence()))
			lk.Release(context.Background())
		}
	})
	for _, mode := range []string{"twice", "range", "never", "after-return", "nil-ok"} {
		t.Run("RefreshBatch "+mode, func(t *testing.T) {
			b := &batchJunk{mode: mode}
			lease := &okLease{}
			b.try = func() (driver.Grant, error) { return driver.Grant{Lease: lease, Token: 1}, nil }
			a := dlock.NewEngine(b)
			lk, err := a.TryAcquire(context.Background(), "k", dlock.WithTTL(150*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-lk.Lost():
				t.Logf("lost after %d batches: %v", b.calls.Load(), lk.Err())
			case <-time.After(600 * time.Millisecond):
				t.Logf("still held after 600ms, %d batches", b.calls.Load())
			}
			lk.Release(context.Background())
		})
	}
}

// Watch returning (nil, nil), and a Subscription whose C() is nil.
type nilWatch struct{ junkBackend }

func (*nilWatch) Watch(ctx context.Context, key string) (driver.Subscription, error) { return nil, nil }

func TestRedNilSubscription(t *testing.T) {
	b := &nilWatch{}
	b.try = func() (driver.Grant, error) {
		return driver.Grant{}, &dlock.NotAcquiredError{Key: "k", Holders: []dlock.Holder{{Owner: "h", TTL: time.Second}}}
	}
	a := dlock.NewEngine(b)
	_, err := a.Acquire(context.Background(), "k", dlock.WithWait(100*time.Millisecond))
	t.Logf("Acquire with Watch()=(nil,nil): %v, tries %d", err, b.tries.Load())
}

// A typed-nil Locker passed to Do.
func TestRedTypedNilLocker(t *testing.T) {
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("PANIC: Do with a typed-nil *memlock.Locker: %v", r)
		}
	}()
	var m *memlock.Locker
	err := dlock.Do(context.Background(), m, "k", func(context.Context, *dlock.Lock) error { return nil })
	if !errors.Is(err, dlock.ErrNilClient) {
		t.Errorf("Do(nil *memlock.Locker) = %v, want ErrNilClient", err)
	}
}

// A context whose Done() is nil but that has a deadline (a hand-written
// Context): calls run on the caller's goroutine and ignore the deadline.
type deadlineNoDone struct{ context.Context }

func (deadlineNoDone) Done() <-chan struct{} { return nil }

func TestRedDeadlineButNilDone(t *testing.T) {
	st := newStore()
	c := newSlowClient(st)
	a := dlock.NewEngine(c)
	resume := c.hang("try")
	defer resume()
	inner, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := a.TryAcquire(deadlineNoDone{inner}, "k"); done <- err }()
	select {
	case err := <-done:
		t.Logf("returned: %v", err)
		if !errors.Is(err, dlock.ErrUnavailable) {
			t.Errorf("err = %v, want ErrUnavailable", err)
		}
	case <-time.After(time.Second):
		t.Errorf("TryAcquire with a 100ms Deadline() but nil Done() still blocked after 1s (runs on the caller's goroutine)")
		resume()
		<-done
	}
}

func (*junkBackend) Spec() driver.Spec { return driver.Spec{Name: "test"} }
