package dlock

// Regression tests from the red-team review (issue 9) that need the watchdog's internals to force an
// interleaving (run: go test -p 1 -run TestRedInternal -v .).

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// gateBackend: one key, leases that expire on a "server" map; Refresh can
// be gated.
type gateBackend struct {
	mu      sync.Mutex
	expires map[string]time.Time
	owner   map[string]string
	gate    chan struct{} // when non-nil, Refresh waits on it
}

func newGateBackend() *gateBackend {
	return &gateBackend{expires: map[string]time.Time{}, owner: map[string]string{}}
}

func (b *gateBackend) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e, ok := b.expires[req.Key]; ok && time.Now().Before(e) {
		return driver.Grant{}, &NotAcquiredError{Key: req.Key, Holders: []Holder{{Owner: b.owner[req.Key], TTL: time.Until(e)}}}
	}
	b.expires[req.Key] = time.Now().Add(req.TTL)
	b.owner[req.Key] = req.Owner
	return driver.Grant{Lease: &gateLease{b: b, key: req.Key, owner: req.Owner}, Token: 1}, nil
}

type gateLease struct {
	b          *gateBackend
	key, owner string
}

func (l *gateLease) Refresh(ctx context.Context, ttl time.Duration) error {
	l.b.mu.Lock()
	g := l.b.gate
	l.b.mu.Unlock()
	if g != nil {
		<-g
	}
	l.b.mu.Lock()
	defer l.b.mu.Unlock()
	if l.b.owner[l.key] != l.owner || !time.Now().Before(l.b.expires[l.key]) {
		return fmt.Errorf("%w", ErrNotHeld)
	}
	l.b.expires[l.key] = time.Now().Add(ttl)
	return nil
}

func (l *gateLease) Release(ctx context.Context) error {
	l.b.mu.Lock()
	defer l.b.mu.Unlock()
	if l.b.owner[l.key] == l.owner {
		delete(l.b.expires, l.key)
		delete(l.b.owner, l.key)
	}
	return nil
}

// A manual Refresh whose success lands while a watchdog pass that already
// counted the lock as expired (took it out of the heap) is about to lose
// it: the pass finds the deadline moved and must keep the new one
// watched. Nothing re-armed the timer, so the lock's new deadline never
// fired and Lost() stayed open while the server lease expired. The test
// runs the pass's steps itself, on a fake clock, in the order that
// interleaving takes.
func TestWatchdog_RefreshDuringPassKeepsNewDeadlineWatched(t *testing.T) {
	e, fc := fakeEngine(&countingBackend{})
	w := e.wd
	const ttl = 200 * time.Millisecond
	lk := acquireNow(t, e, "b", WithTTL(ttl), WithAutoRefresh(false))
	old := lk.Deadline()
	// The pass starts just past the old deadline and collects the lock.
	fc.Spend(old.Sub(fc.Now()) + time.Millisecond)
	var fired passLead
	var due []*Lock
	expired, at, _ := w.collect(true, false, &fired, &due)
	if len(expired) != 1 || expired[0] != lk {
		t.Fatalf("the pass collected %d locks, want the one past its deadline", len(expired))
	}
	// Meanwhile the Refresh's success moves the deadline (as renewed does
	// once it has checked the old one had not passed when it was sent).
	newDeadline := fc.Now().Add(ttl)
	lk.mu.Lock()
	lk.deadline = newDeadline
	w.setDeadline(lk, newDeadline)
	lk.mu.Unlock()
	// The pass goes on to lose what it collected: the lock is not lost,
	// and its new deadline is watched.
	cleanupAll(loseAll(w, expired, at))
	if err := lk.Err(); err != nil {
		t.Fatalf("a lock refreshed before the pass lost it was lost: %v", err)
	}
	w.mu.Lock()
	armed := w.timerAt
	w.mu.Unlock()
	if armed.IsZero() || armed.After(newDeadline) {
		t.Fatalf("after the pass, the timer is armed for %v, want by the new deadline %v", armed, newDeadline)
	}
	rec := recordLosses(fc, 0, []*Lock{lk})
	rec.run(t, 100)
	if worst, late := rec.late(); late > 0 {
		t.Fatalf("the refreshed lock was lost %v after its new deadline", worst)
	}
}

// notifyLease is a lease that implements LossNotifier in the two ways a
// backend is likely to get wrong, neither forbidden by the SPI doc.
type notifyLease struct {
	gateLease
	mode string // "lose-in-stop", "lose-in-bind", "mutex"
	mu   sync.Mutex
	lose func(error)
}

func (l *notifyLease) Bind(lose func(cause error)) func() {
	switch l.mode {
	case "lose-in-bind":
		lose(fmt.Errorf("%w: session already gone", ErrNotHeld))
		return func() {}
	case "lose-in-stop":
		return func() { lose(fmt.Errorf("watch closed")) } // synchronous
	case "mutex":
		l.lose = lose
		return func() { l.mu.Lock(); l.lose = nil; l.mu.Unlock() }
	}
	return nil
}

// fire simulates the backend's watch goroutine noticing a loss: under its
// own mutex (to not race with stop), it calls lose.
func (l *notifyLease) fire(entered chan<- struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	close(entered)
	time.Sleep(50 * time.Millisecond) // widen the window
	if l.lose != nil {
		l.lose(fmt.Errorf("%w: session expired", ErrNotHeld))
	}
}

type notifyBackend struct {
	*gateBackend
	mode string
	last *notifyLease
}

func (b *notifyBackend) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	g, err := b.gateBackend.Try(ctx, req)
	if err != nil {
		return g, err
	}
	nl := &notifyLease{gateLease: *g.Lease.(*gateLease), mode: b.mode}
	b.last = nl
	g.Lease = nl
	return g, nil
}

// F6: LossNotifier re-entrancy. (a) a stop function that reports the loss
// synchronously self-deadlocks Release (stop runs under l.mu, lose takes
// l.mu); (b) a backend that calls lose under its own mutex while stop takes
// that mutex deadlocks Release against the backend (ABBA: l.mu -> backend
// mutex in Release, backend mutex -> l.mu in the watch goroutine).
func TestRedInternalLossNotifierDeadlocks(t *testing.T) {
	for _, mode := range []string{"lose-in-stop", "mutex"} {
		t.Run(mode, func(t *testing.T) {
			nb := &notifyBackend{gateBackend: newGateBackend(), mode: mode}
			a := NewEngine(nb)
			lk, err := a.TryAcquire(context.Background(), "k", WithTTL(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if mode == "mutex" {
				entered := make(chan struct{})
				go nb.last.fire(entered)
				<-entered
			}
			done := make(chan error, 1)
			go func() { done <- lk.Release(context.Background()) }()
			select {
			case err := <-done:
				t.Logf("held: Release returned %v", err)
			case <-time.After(2 * time.Second):
				t.Errorf("DEADLOCK: Release blocked for 2s (mode %s); the lock's mutex is held for ever, Err()/Deadline()/Refresh() now hang too", mode)
				errc := make(chan struct{})
				go func() { lk.Err(); close(errc) }()
				select {
				case <-errc:
				case <-time.After(200 * time.Millisecond):
					t.Logf("confirmed: lk.Err() blocks as well")
				}
			}
		})
	}
}

// F6c: a loss reported during Bind hands out a lock that is lost at birth
// (the design says no lock is handed out lost at birth).
func TestRedInternalLostAtBirth(t *testing.T) {
	nb := &notifyBackend{gateBackend: newGateBackend(), mode: "lose-in-bind"}
	a := NewEngine(nb)
	lk, err := a.TryAcquire(context.Background(), "k", WithTTL(time.Second))
	if err != nil {
		t.Logf("held: %v", err)
		return
	}
	if lk.Err() != nil {
		t.Errorf("MISLEADING: TryAcquire returned success (err nil) with a lock that is already lost: %v", lk.Err())
	}
	_ = lk.Release(context.Background())
}

func (*gateBackend) Spec() driver.Spec { return driver.Spec{Name: "test"} }

func (*notifyBackend) Spec() driver.Spec { return driver.Spec{Name: "test"} }
