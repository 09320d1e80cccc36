package dlock_test

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

// hangTimeout bounds every wait in these tests; exceeding it is a hang.
const hangTimeout = 30 * time.Second

// overrunBound is how far past its context's deadline a call may return
// before the test calls it a hang. It is generous on purpose (a slow
// machine must not fail the test); the defects it catches overran by
// seconds (a default go-redis client waits 3s per read, then retries).
const overrunBound = 2 * time.Second

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), hangTimeout)
	t.Cleanup(cancel)
	return ctx
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// waitFor polls cond every millisecond until it holds, or fails as a hang.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(hangTimeout); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("hang: %s did not happen within %v", what, hangTimeout)
		}
	}
}

// Defect: Acquire overran its context by seconds against a hung server,
// and an outage came back as ErrNotAcquired ("held").
func TestAcquireReturnsByDeadlineAgainstHungBackend(t *testing.T) {
	st := newStore()
	c := newSlowClient(st)
	l := dlock.NewEngine(c)
	resume := c.hang("try")
	defer resume()
	for _, try := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		start := time.Now()
		var err error
		if try {
			_, err = l.TryAcquire(ctx, "k", dlock.WithTTL(time.Minute))
		} else {
			_, err = l.Acquire(ctx, "k", dlock.WithTTL(time.Minute))
		}
		overrun := time.Since(start) - 200*time.Millisecond
		cancel()
		t.Logf("try=%v: returned %v after the deadline: %v", try, overrun, err)
		if overrun > overrunBound {
			t.Fatalf("try=%v: returned %v after its deadline", try, overrun)
		}
		if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("try=%v: err = %v, want ErrUnavailable and DeadlineExceeded, not ErrNotAcquired", try, err)
		}
	}
	// The abandoned attempts complete once the server answers; the leases
	// they were granted are released at once, not left to their minute.
	resume()
	waitFor(t, "the abandoned grants to be undone", func() bool {
		return c.count("try") >= 2 && st.holder("k") == ""
	})
}

// An outage that starts while Acquire waits for a holder is reported as
// an outage, not as "held".
func TestOutageDuringWaitIsNotNotAcquired(t *testing.T) {
	st := newStore()
	other := dlock.NewEngine(newSlowClient(st))
	held, err := other.Acquire(ctxT(t), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	c := newSlowClient(st)
	l := dlock.NewEngine(c)
	errc := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctxT(t), "k", dlock.WithWait(time.Second))
		errc <- err
	}()
	waitFor(t, "the waiter's first attempt", func() bool { return c.count("try") >= 1 })
	resume := c.hang("try")
	defer resume()
	err = <-errc
	if errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable, not ErrNotAcquired", err)
	}
	t.Log(err)
}

// A grant that arrives after its local deadline is given back and the
// attempt repeated, instead of a lock that is lost at birth.
func TestGrantWithoutValidityIsRetried(t *testing.T) {
	st := newStore()
	c := newSlowClient(st)
	l := dlock.NewEngine(c)
	resume := c.hang("try")
	type res struct {
		lk  *dlock.Lock
		err error
	}
	done := make(chan res, 1)
	go func() {
		lk, err := l.Acquire(context.Background(), "k", dlock.WithTTL(200*time.Millisecond))
		done <- res{lk, err}
	}()
	waitFor(t, "the first attempt", func() bool { return c.count("try") >= 1 })
	time.Sleep(300 * time.Millisecond)
	resume()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.lk.Release(context.Background())
	if r.lk.Err() != nil || r.lk.Token() != 2 {
		t.Fatalf("lock: err %v token %d, want a live lock with token 2 (the stale grant given back)", r.lk.Err(), r.lk.Token())
	}
}

// Defect: concurrent Release calls reported a healthy lock as lost.
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

// Release against a hung server returns by its context; the request goes
// on, and a later Release reports its success.
func TestReleaseReturnsByDeadlineAgainstHungBackend(t *testing.T) {
	st := newStore()
	c := newSlowClient(st)
	l := dlock.NewEngine(c)
	lk, err := l.Acquire(ctxT(t), "k", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	resume := c.hang("release")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = lk.Release(ctx)
	if d := time.Since(start) - 200*time.Millisecond; d > overrunBound {
		t.Fatalf("Release returned %v after its deadline", d)
	}
	if !errors.Is(err, dlock.ErrUnavailable) || errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Release = %v, want ErrUnavailable", err)
	}
	if !closed(lk.Lost()) || !errors.Is(lk.Err(), dlock.ErrReleased) {
		t.Fatalf("after Release: Lost closed %v, Err %v", closed(lk.Lost()), lk.Err())
	}
	// Refresh is bounded the same way.
	resumeR := c.hang("refresh")
	lk2, err := l.Acquire(ctxT(t), "k2", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer rcancel()
	if err := lk2.Refresh(rctx); !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("Refresh against a hung server = %v, want ErrUnavailable", err)
	}
	resumeR()
	resume()
	if err := lk.Release(ctxT(t)); err != nil {
		t.Fatalf("second Release = %v, want nil", err)
	}
	if st.holder("k") != "" {
		t.Fatal("key still held")
	}
	if err := lk2.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// Defect: Do and WithLock never released when fn panicked; the watchdog
// renewed the lock for the life of the process.
func TestDoReleasesWhenFnPanics(t *testing.T) {
	l := dlock.NewEngine(newSlowClient(newStore()))
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the panic to go on", r)
			}
		}()
		_ = dlock.Do(ctxT(t), l, "k", func(context.Context, *dlock.Lock) error { panic("boom") })
	}()
	if n := dlock.Renewing(l); n != 0 {
		t.Fatalf("%d locks still renewed after the panic", n)
	}
	lk, err := l.TryAcquire(ctxT(t), "k")
	if err != nil {
		t.Fatalf("key not released after the panic: %v", err)
	}
	lk.Release(context.Background())
}

// Defect: Refresh(nil) panicked (in a library goroutine on some
// backends), Release on a nil *Lock panicked.
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

// Defect: huge TTLs overflowed backends; WithDrift(NaN) was accepted and
// lost every lock at once.
func TestConfigLimits(t *testing.T) {
	ok := []dlock.Option{dlock.WithTTL(dlock.MaxTTL), dlock.WithTTL(dlock.MinTTL)}
	for _, o := range ok {
		if _, err := dlock.NewConfig("k", 0, o); err != nil {
			t.Errorf("valid option: %v", err)
		}
	}
	bad := map[string]struct {
		opt  dlock.Option
		want error
	}{
		"ttl above max":    {dlock.WithTTL(dlock.MaxTTL + time.Millisecond), dlock.ErrInvalidTTL},
		"ttl max int64":    {dlock.WithTTL(math.MaxInt64), dlock.ErrInvalidTTL},
		"ttl min int64":    {dlock.WithTTL(math.MinInt64), dlock.ErrInvalidTTL},
		"drift NaN":        {dlock.WithDrift(math.NaN(), 0), dlock.ErrInvalidOption},
		"drift +Inf":       {dlock.WithDrift(math.Inf(1), 0), dlock.ErrInvalidOption},
		"drift -Inf":       {dlock.WithDrift(math.Inf(-1), 0), dlock.ErrInvalidOption},
		"drift factor 0.5": {dlock.WithDrift(0.5, 0), dlock.ErrInvalidOption},
		"drift min ≥ ttl":  {dlock.WithDrift(0, math.MaxInt64), dlock.ErrInvalidOption},
		"drift min < 0":    {dlock.WithDrift(0, -1), dlock.ErrInvalidOption},
		"max hold < 0":     {dlock.WithMaxHold(math.MinInt64), dlock.ErrInvalidOption},
		"wait < 0":         {dlock.WithWait(-time.Nanosecond), dlock.ErrInvalidOption},
	}
	for name, c := range bad {
		if _, err := dlock.NewConfig("k", 0, c.opt); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", name, err, c.want)
		}
	}
	// Huge waits and hold caps are "forever", not an overflow.
	l := memlock.New()
	lk, err := l.Acquire(ctxT(t), "k", dlock.WithWait(math.MaxInt64), dlock.WithMaxHold(math.MaxInt64))
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Err(); err != nil {
		t.Fatalf("lock with a huge hold cap lost at once: %v", err)
	}
	lk.Release(context.Background())
}

// A Backoff that returns zero or negative delays must not make a waiter
// spin.
type zeroBackoff struct{}

func (zeroBackoff) Next(int) time.Duration { return -time.Hour }

func TestNonPositiveBackoffDoesNotSpin(t *testing.T) {
	st := newStore()
	holder := dlock.NewEngine(newSlowClient(st))
	held, err := holder.Acquire(ctxT(t), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	c := newSlowClient(st)
	l := dlock.NewEngine(c)
	_, err = l.Acquire(ctxT(t), "k", dlock.WithWait(100*time.Millisecond), dlock.WithBackoff(zeroBackoff{}))
	if !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("err = %v", err)
	}
	// At 1ms per attempt at least, 100ms allow about a hundred attempts;
	// a spinning loop makes hundreds of thousands.
	if n := c.count("try"); n > 1000 {
		t.Fatalf("%d attempts in 100ms: the wait loop spins", n)
	}
}
