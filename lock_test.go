package dlock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/memlock"
)

func TestLockContext(t *testing.T) {
	l := memlock.New()
	ctx := context.Background()
	lk, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	lctx, cancel := lk.Context(ctx)
	defer cancel()
	l.Expire("k")
	if err := lk.Refresh(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Refresh after expiry = %v", err)
	}
	select {
	case <-lctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("lock context not cancelled on loss")
	}
	if !errors.Is(context.Cause(lctx), dlock.ErrLockLost) {
		t.Fatalf("cause = %v", context.Cause(lctx))
	}
}

// Lock.Context of a lock already lost or released is done when returned,
// with the loss or the release as its cause.
// Symptom: it returned a live context until a goroutine hop later.
func TestLock_ContextOfLostOrReleasedLockIsDone(t *testing.T) {
	l := memlock.New()
	ctx := context.Background()
	lk, err := l.TryAcquire(ctx, "lock/lc", dlock.WithTTL(150*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	l.Expire("lock/lc")
	<-lk.Lost()
	c, cancel := lk.Context(ctx)
	defer cancel()
	if c.Err() == nil || !errors.Is(context.Cause(c), dlock.ErrLockLost) {
		t.Fatalf("Lock.Context of a lost lock: err %v cause %v", c.Err(), context.Cause(c))
	}
	lk2, _ := l.TryAcquire(ctx, "lock/lc2")
	lk2.Release(ctx)
	c2, cancel2 := lk2.Context(ctx)
	defer cancel2()
	if c2.Err() == nil || !errors.Is(context.Cause(c2), dlock.ErrReleased) {
		t.Fatalf("Lock.Context of a released lock: err %v cause %v", c2.Err(), context.Cause(c2))
	}
}

// Concurrent Release calls of a healthy lock all succeed.
// Symptom: concurrent Release calls reported a healthy lock as lost.
func TestConcurrentReleaseIsHarmless(t *testing.T) {
	for name, l := range map[string]dlock.Locker{
		"memlock": memlock.New(),
		"slow":    dlock.NewEngine(newSlowClient(newStore())),
	} {
		t.Run(name, func(t *testing.T) {
			lk, err := l.Acquire(ctxT(t), "k")
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			errs := make(chan error, 20)
			for range 20 {
				wg.Go(func() { errs <- lk.Release(context.Background()) })
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Errorf("Release: %v", err)
				}
			}
			if !errors.Is(lk.Err(), dlock.ErrReleased) {
				t.Fatalf("Err() = %v, want ErrReleased", lk.Err())
			}
		})
	}
}

// A nil *Lock and nil contexts are errors (or, for Release(nil), a bounded
// release), never panics.
// Symptom: Refresh(nil) and Release on a nil *Lock panicked.
func TestNilLockAndNilContext(t *testing.T) {
	var nl *dlock.Lock
	if err := nl.Release(context.Background()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("nil Release = %v", err)
	}
	if err := nl.Refresh(context.Background()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("nil Refresh = %v", err)
	}
	if nl.Err() == nil || !closed(nl.Lost()) || nl.Key() != "" || nl.Token() != 0 || nl.Owner() != "" || nl.TTL() != 0 || nl.Metadata() != nil || !nl.Deadline().IsZero() || nl.Fence() != (dlock.Fence{}) {
		t.Error("nil *Lock accessors")
	}
	ctx, cancel := nl.Context(nil) //nolint:staticcheck // nil on purpose
	defer cancel()
	if ctx.Err() == nil {
		t.Error("context of a nil lock not cancelled")
	}
	l := memlock.New()
	//lint:ignore SA1012 nil on purpose
	if _, err := l.Acquire(nil, "k"); !errors.Is(err, dlock.ErrInvalidOption) { //nolint:staticcheck
		t.Errorf("Acquire(nil ctx) = %v", err)
	}
	lk, err := l.Acquire(ctxT(t), "k")
	if err != nil {
		t.Fatal(err)
	}
	//lint:ignore SA1012 nil on purpose
	if err := lk.Refresh(nil); !errors.Is(err, dlock.ErrInvalidOption) { //nolint:staticcheck
		t.Errorf("Refresh(nil) = %v", err)
	}
	//lint:ignore SA1012 nil on purpose
	if err := lk.Release(nil); err != nil { //nolint:staticcheck
		t.Errorf("Release(nil) = %v", err)
	}
	if err := dlock.Do(ctxT(t), l, "k", nil); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("Do(nil fn) = %v", err)
	}
}

func TestHoldCapLossReason(t *testing.T) {
	rec := &dlocktest.Recorder{}
	l := memlock.New(dlock.WithObserver(rec))
	lk, err := l.Acquire(ctxT(t), "k", dlock.WithTTL(200*time.Millisecond), dlock.WithMaxHold(250*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	<-lk.Lost()
	var le *dlock.LostError
	if !errors.As(lk.Err(), &le) || le.Reason != dlock.LossHoldCap || !errors.Is(lk.Err(), dlock.ErrHoldCapReached) {
		t.Fatalf("Err() = %v, want reason hold_cap", lk.Err())
	}
}

// flipCtx is a context whose deadline passes right after the first time
// anyone asks it Err(): the legal behaviour of a context whose timer fires
// between two checks (the contract only requires Err to be nil until Done
// is closed).
type flipCtx struct {
	context.Context
	once   sync.Once
	ch     chan struct{}
	n      atomic.Int32
	cancel func()
}

func newFlipCtx() *flipCtx { return &flipCtx{Context: context.Background(), ch: make(chan struct{})} }

func (c *flipCtx) Done() <-chan struct{} { return c.ch }

func (c *flipCtx) Err() error {
	if c.n.Add(1) == 1 {
		return nil // still alive at the first check...
	}
	c.once.Do(func() { close(c.ch) }) // ...and expired a nanosecond later
	return context.DeadlineExceeded
}

// A Release whose context expires between Release's own ctx.Err() check
// and call()'s check ends its release flight: a retried Release on a
// healthy backend succeeds, and one with context.Background() returns.
// Symptom: the flight never landed and every later Release hung or failed.
func TestRelease_RetrySucceedsAfterContextExpiredMidCall(t *testing.T) {
	st := newStore()
	c := newSlowClient(st)
	a := dlock.NewEngine(c)
	lk, err := a.TryAcquire(context.Background(), "k", dlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	err = lk.Release(newFlipCtx())
	t.Logf("first Release (ctx expired mid-call): %v", err)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	t0 := time.Now()
	err = lk.Release(ctx)
	t.Logf("second Release(2s ctx) after %v: %v; release requests sent: %d; server holder still %q",
		time.Since(t0).Round(time.Millisecond), err, c.count("release"), st.holder("k"))
	if err != nil {
		t.Errorf("BROKEN: a retried Release on a healthy backend fails: %v", err)
	}
	// With context.Background() (Done()==nil) the retry blocks forever on the
	// stuck flight: demonstrate with a bounded wait.
	done := make(chan error, 1)
	go func() { done <- lk.Release(context.Background()) }()
	select {
	case err := <-done:
		t.Logf("Release(Background) returned %v", err)
	case <-time.After(time.Second):
		t.Errorf("HANG: Release(context.Background()) still blocked after 1s (goroutine leaks for ever)")
	}
}

// As above, with real short deadlines: every Release retried after one
// whose deadline expired succeeds.
// Symptom: locks could never be released again after a Release whose short deadline expired.
func TestRelease_RetrySucceedsAfterShortDeadline(t *testing.T) {
	st := newStore()
	c := newSlowClient(st)
	a := dlock.NewEngine(c)
	wedged := 0
	const n = 3000
	for i := 0; i < n; i++ {
		lk, err := a.TryAcquire(context.Background(), "k", dlock.WithTTL(time.Second), dlock.WithAutoRefresh(false))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%40)*100*time.Nanosecond)
		_ = lk.Release(ctx)
		cancel()
		// "Never again" is not a deadline: the retry has time enough for
		// a loaded machine (20ms failed under -race beside other tests).
		ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
		if err := lk.Release(ctx2); err != nil {
			wedged++
			if wedged == 1 {
				t.Logf("iteration %d: retried Release: %v", i, err)
			}
			st.mu.Lock()
			delete(st.entries, "k") // let the next iteration acquire
			st.mu.Unlock()
		}
		cancel2()
	}
	if wedged > 0 {
		t.Errorf("BROKEN: %d of %d locks could never be released again after a Release whose short deadline expired", wedged, n)
	}
}

// Concurrent Release, Refresh, Context, Deadline, Err and Lost on one Lock
// (run with -race) leave it released or lost, nothing else.
// Symptom guarded against: a data race or a final Release error other than the loss.
func TestLock_ConcurrentMisuseIsSafe(t *testing.T) {
	st := newStore()
	c := newSlowClient(st)
	a := dlock.NewEngine(c)
	for round := 0; round < 30; round++ {
		lk, err := a.TryAcquire(context.Background(), "k", dlock.WithTTL(100*time.Millisecond), dlock.WithMaxHold(time.Duration(round)*3*time.Millisecond+30*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Go(func() {
				for i := 0; i < 20; i++ {
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i)*50*time.Microsecond)
					switch (g + i) % 5 {
					case 0:
						_ = lk.Release(ctx)
					case 1:
						_ = lk.Refresh(ctx)
					case 2:
						c, cc := lk.Context(ctx)
						_ = c.Err()
						cc()
					case 3:
						_, _ = lk.Deadline(), lk.Err()
					case 4:
						select {
						case <-lk.Lost():
						default:
						}
					}
					cancel()
				}
			})
		}
		wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err = lk.Release(ctx)
		cancel()
		if err != nil && !errors.Is(err, dlock.ErrLockLost) {
			t.Errorf("round %d: final Release: %v", round, err)
		}
		st.mu.Lock()
		delete(st.entries, "k")
		st.mu.Unlock()
	}
}
