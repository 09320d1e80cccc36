package dlock_test

// Regression tests from the red-team review of the core (issue 9). Each
// failed before its fix.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

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

// F1: a Release whose context expires between Release's own ctx.Err()
// check and call()'s check never sends the request and never ends the
// release flight: every later Release joins a flight that never lands.
func TestRedReleaseFlightWedgedByExpiringContext(t *testing.T) {
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

// F1b: the same wedge, reached naturally with real short deadlines.
func TestRedReleaseFlightWedgedNaturally(t *testing.T) {
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

// closedSub is a subscription whose channel is closed (a backend closing
// the channel when its pub/sub connection drops, or on Close).
type closedSub struct{ ch chan struct{} }

func (s closedSub) C() <-chan struct{} { return s.ch }
func (s closedSub) Close()             {}

type closedWatchClient struct{ *slowClient }

func (c closedWatchClient) Watch(ctx context.Context, key string) (driver.Subscription, error) {
	ch := make(chan struct{})
	close(ch)
	return closedSub{ch}, nil
}

// F2: a subscription channel that is closed turns the wait loop into a
// busy loop against the server: no backoff at all.
func TestRedClosedSubscriptionSpins(t *testing.T) {
	st := newStore()
	holder := dlock.NewEngine(newSlowClient(st))
	lk, err := holder.TryAcquire(context.Background(), "k", dlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	c := newSlowClient(st)
	a := dlock.NewEngine(closedWatchClient{c})
	_, err = a.Acquire(context.Background(), "k", dlock.WithWait(100*time.Millisecond))
	tries := c.count("try")
	t.Logf("Acquire waited 100ms: %v; Try calls: %d (DefaultBackoff would make ~6)", err, tries)
	if tries > 100 {
		t.Errorf("SPIN: %d attempts in 100ms: a closed subscription channel defeats the backoff", tries)
	}
}

// F4: Backoff arithmetic with large values panics inside dlock.
func TestRedBackoffOverflowPanics(t *testing.T) {
	try := func(name string, f func()) {
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("PANIC in %s: %v", name, r)
			}
		}()
		f()
	}
	try("ExpBackoff{Min: 1<<62, Max: 1<<63-1}.Next(2)", func() {
		dlock.ExpBackoff{Min: 1 << 62, Max: 1<<63 - 1}.Next(2)
	})
	try("ExpBackoff{Min: 1h, Max: 1<<63-1}.Next(50)", func() {
		dlock.ExpBackoff{Min: time.Hour, Max: 1<<63 - 1}.Next(50)
	})
	try("ConstBackoff{Jitter: 1<<62}.Next(1)", func() {
		dlock.ConstBackoff{Delay: time.Second, Jitter: 1 << 62}.Next(1)
	})
}

// F4b: through Acquire: the panic happens on the caller's goroutine while
// waiting, after the key was observed held.
func TestRedBackoffPanicThroughAcquire(t *testing.T) {
	m := memlock.New()
	lk, err := m.TryAcquire(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("PANIC from Acquire with WithBackoff(ConstBackoff{Delay:1ms, Jitter:1<<62}): %v", r)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = m.Acquire(ctx, "k", dlock.WithBackoff(dlock.ConstBackoff{Delay: time.Millisecond, Jitter: 1 << 62}))
	t.Logf("Acquire: %v", err)
}

var _ = errors.Is

// Held (expected to pass): concurrent misuse of one Lock under -race.
func TestRedConcurrentMisuse(t *testing.T) {
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
