package dlock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// writerRegistryDriver is a lock service whose key is always held and
// that records waiting writers (driver: Writer preference, without a
// queue), the way a network backend does; an attempt can be made to hang, ignoring its
// context, until a gate closes (a stalled link), after which it reaches the
// server and registers its waiter. It tests the core's wiring of
// Request.Waiter and Leaver; the backends are tested against real servers.
type writerRegistryDriver struct {
	mu      sync.Mutex
	writers map[string]bool
	tries   int
	gate    chan struct{} // the attempt after the first one hangs on it
	late    chan struct{} // closed once that attempt has registered
}

func (d *writerRegistryDriver) Spec() driver.Spec { return driver.Spec{Name: "writer-registry"} }

func (d *writerRegistryDriver) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	d.mu.Lock()
	d.tries++
	n := d.tries
	d.mu.Unlock()
	if n == 2 {
		<-d.gate // ignores ctx: the reply is on its way
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if req.Waiter != "" {
		d.writers[req.Waiter] = true
	}
	if n == 2 {
		close(d.late)
	}
	return driver.Grant{}, &dlock.NotAcquiredError{Key: req.Key, Holders: []dlock.Holder{{Owner: "someone", TTL: time.Minute}}}
}

func (d *writerRegistryDriver) Leave(ctx context.Context, key, waiter string) error {
	d.mu.Lock()
	delete(d.writers, waiter)
	d.mu.Unlock()
	return nil
}

func (d *writerRegistryDriver) registered() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.writers)
}

// A waiting writer whose Acquire ended while an attempt was in flight (and
// abandoned) does not stay registered: once the abandoned attempt reaches
// the server and registers the writer again, the core leaves again
// (driver.Leaver: "stops keeping readers out at once").
// Symptom: a writer that had given up kept readers out for a TTL.
func TestAcquire_AbandonedAttemptWithdrawsWriterRegistration(t *testing.T) {
	d := &writerRegistryDriver{writers: map[string]bool{}, gate: make(chan struct{}), late: make(chan struct{})}
	e := dlock.NewEngine(d)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	// TTL 300ms: attempts at least every 100ms, so the second one is
	// under way (and hangs) when the context ends.
	if _, err := e.Acquire(ctx, "writer/w", dlock.WithTTL(300*time.Millisecond)); err == nil {
		t.Fatal("acquired a held key")
	}
	// The Acquire has returned; its Leave runs in the background.
	deadline := time.Now().Add(2 * time.Second)
	for d.registered() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if d.registered() != 0 {
		t.Fatal("the registration stayed after the Acquire ended")
	}
	close(d.gate) // the abandoned attempt now reaches the server
	<-d.late
	deadline = time.Now().Add(2 * time.Second)
	for d.registered() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := d.registered(); n != 0 {
		t.Errorf("the abandoned attempt left the writer registered (%d) after its Acquire had ended and left", n)
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

// A subscription whose channel is closed is dropped and the wait polls on
// its backoff.
// Symptom: a closed subscription channel turned the wait into a busy loop against the server.
func TestAcquire_ClosedSubscriptionFallsBackToBackoff(t *testing.T) {
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

// nilWatch is a Watcher whose Watch returns (nil, nil).
type nilWatch struct{ junkBackend }

func (*nilWatch) Watch(ctx context.Context, key string) (driver.Subscription, error) { return nil, nil }

// An Acquire on a driver whose Watch returns no subscription and no error
// waits by polling, without a panic.
func TestAcquire_NilSubscriptionFallsBackToPolling(t *testing.T) {
	b := &nilWatch{}
	b.try = func() (driver.Grant, error) {
		return driver.Grant{}, &dlock.NotAcquiredError{Key: "k", Holders: []dlock.Holder{{Owner: "h", TTL: time.Second}}}
	}
	a := dlock.NewEngine(b)
	_, err := a.Acquire(context.Background(), "k", dlock.WithWait(100*time.Millisecond))
	t.Logf("Acquire with Watch()=(nil,nil): %v, tries %d", err, b.tries.Load())
}

// hangCloseDriver refuses the first attempt (a holder), then grants; its
// Watcher's subscriptions hang in Close until unblock is closed, like an
// unsubscribe sent to a hung server.
type hangCloseDriver struct {
	unblock chan struct{}
	mu      sync.Mutex
	n       int
	tok     uint64
}

func (d *hangCloseDriver) Spec() driver.Spec { return driver.Spec{Name: "hang-close"} }

func (d *hangCloseDriver) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n++; d.n == 1 {
		return driver.Grant{}, &dlock.NotAcquiredError{Key: req.Key}
	}
	d.tok++
	return driver.Grant{Lease: hungRenewLease{}, Token: d.tok}, nil
}

func (d *hangCloseDriver) Watch(ctx context.Context, key string) (driver.Subscription, error) {
	return hangCloseSub{ch: make(chan struct{}), unblock: d.unblock}, nil
}

type hangCloseSub struct{ ch, unblock chan struct{} }

func (s hangCloseSub) C() <-chan struct{} { return s.ch }
func (s hangCloseSub) Close()             { <-s.unblock }

// An Acquire that got its lock returns by its context's deadline even when
// closing its release subscription hangs (an unsubscribe to a hung
// server): the close is bounded by the context.
// Symptom: a hung Subscription.Close held Acquire past its deadline, for ever.
func TestAcquire_ReturnsByDeadlineWhenSubscriptionCloseHangs(t *testing.T) {
	d := &hangCloseDriver{unblock: make(chan struct{})}
	defer close(d.unblock)
	e := dlock.NewEngine(d)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		lk, err := e.Acquire(ctx, "k", dlock.WithTTL(time.Second))
		if lk != nil {
			lk.Release(context.Background())
		}
		done <- err
	}()
	select {
	case <-done:
	case <-time.After(1300 * time.Millisecond):
		t.Fatal("Acquire did not return 1s after its deadline: Subscription.Close hangs it")
	}
}

// failAtDeadline fails every attempt with an error of unknown outcome
// (not "held"), returned just as the caller's context ends, and counts the
// undos it is asked for.
type failAtDeadline struct{ aborts atomic.Int32 }

var errReset = errors.New("connection reset")

func (d *failAtDeadline) Spec() driver.Spec { return driver.Spec{Name: "fail-at-deadline"} }

func (d *failAtDeadline) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	<-ctx.Done()
	return driver.Grant{}, errReset
}

func (d *failAtDeadline) Abort(ctx context.Context, req *driver.Request) error {
	d.aborts.Add(1)
	return nil
}

// The background undo of an attempt whose outcome is unknown runs once
// per failed attempt and reads its own copy of the attempt's error.
// Symptom: the undo read the named error result while the return wrote it, a data race under -race.
func TestAcquire_UndoOfUnknownOutcomeIsRaceFree(t *testing.T) {
	d := &failAtDeadline{}
	e := dlock.NewEngine(d)
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		_, err := e.Acquire(ctx, "k")
		cancel()
		if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, errReset) {
			t.Fatalf("err = %v, want ErrUnavailable joined with the driver's error", err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for d.aborts.Load() < 5 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := d.aborts.Load(); n < 5 {
		t.Fatalf("%d undos, want one per failed attempt (5)", n)
	}
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

// zeroBackoff returns a negative delay for every attempt.
type zeroBackoff struct{}

func (zeroBackoff) Next(int) time.Duration { return -time.Hour }

// A Backoff that returns zero or negative delays does not make a waiter
// spin.
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
