package dlock

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// clockedStore is a lock service whose leases expire on a fake clock, as
// on a server: at the time a request is processed plus its TTL, measured
// by a server clock that runs fast by fast (0.005: 0.5%, within the
// drift allowance). Its renewals hang (ignoring their context) while
// hang is set, until the test ends them.
type clockedStore struct {
	fc      *fakeClock
	fast    float64
	mu      sync.Mutex
	expires map[string]time.Time
	owner   map[string]string
	hang    chan struct{} // non-nil: renewals park until it is closed
	hangKey map[string]chan struct{}
	renews  map[string]int // renewals that went through, per key
	// releaseTakes is the fake time a release spends on its way to the
	// store.
	releaseTakes time.Duration
}

func newClockedStore(fc *fakeClock) *clockedStore {
	return &clockedStore{fc: fc, expires: map[string]time.Time{}, owner: map[string]string{},
		hangKey: map[string]chan struct{}{}, renews: map[string]int{}}
}

func (s *clockedStore) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.fc.Now()
	if e, ok := s.expires[req.Key]; ok && now.Before(e) {
		return driver.Grant{}, &NotAcquiredError{Key: req.Key, Holders: []Holder{{Owner: s.owner[req.Key], TTL: e.Sub(now)}}}
	}
	s.expires[req.Key], s.owner[req.Key] = now.Add(s.serverTTL(req.TTL)), req.Owner
	return driver.Grant{Lease: &clockedLease{s: s, key: req.Key, owner: req.Owner}, Token: 1}, nil
}

func (*clockedStore) Spec() driver.Spec { return driver.Spec{Name: "test"} }

// serverTTL is how long a lease of ttl lasts by the test's clock.
func (s *clockedStore) serverTTL(ttl time.Duration) time.Duration {
	return time.Duration(float64(ttl) * (1 - s.fast))
}

// expiry is when key's lease ends on the server.
func (s *clockedStore) expiry(key string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.expires[key]
}

type clockedLease struct {
	s          *clockedStore
	key, owner string
}

func (l *clockedLease) Refresh(ctx context.Context, ttl time.Duration) error {
	l.s.mu.Lock()
	hang := l.s.hang
	if h := l.s.hangKey[l.key]; h != nil {
		hang = h
	}
	l.s.mu.Unlock()
	if hang != nil {
		l.s.fc.Park()
		<-hang
		return context.DeadlineExceeded
	}
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	now := l.s.fc.Now()
	if l.s.owner[l.key] != l.owner || !now.Before(l.s.expires[l.key]) {
		return ErrNotHeld
	}
	l.s.expires[l.key] = now.Add(l.s.serverTTL(ttl))
	l.s.renews[l.key]++
	return nil
}

func (l *clockedLease) Release(ctx context.Context) error {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	l.s.fc.Spend(l.s.releaseTakes)
	if l.s.owner[l.key] != l.owner || !l.s.fc.Now().Before(l.s.expires[l.key]) {
		return ErrNotHeld
	}
	if l.s.owner[l.key] == l.owner {
		delete(l.s.expires, l.key)
		delete(l.s.owner, l.key)
	}
	return nil
}

// A lock with a hold cap whose renewals hang after one renewal clipped to
// the cap, its server's clock 0.5% fast (within the drift allowance): its
// Lost() closes before the server lease ends, so before anyone else can
// be granted the key.
// Symptom: Lost() stayed open past the server's expiry (the clipped renewal did not move the local deadline earlier).
func TestHoldCap_LostBeforeServerLeaseEnds(t *testing.T) {
	fc := newFakeClock()
	st := newClockedStore(fc)
	st.fast = 0.005
	e := NewEngine(st)
	e.wd.clk = fc
	const ttl, hold = 3 * time.Second, 2500 * time.Millisecond
	lk := acquireNow(t, e, "k", WithTTL(ttl), WithMaxHold(hold))
	rec := recordLosses(fc, 0, []*Lock{lk})
	// The first renewal (at TTL/3, its TTL clipped to what the cap
	// leaves) goes through; the ones after it hang.
	first := st.expiry("k")
	for i := 0; st.expiry("k").Equal(first); i++ {
		if i == 1000 || !fc.Step() {
			t.Fatal("no renewal went through")
		}
	}
	serverEnd := st.expiry("k")
	if capEnd := lk.acquired.Add(hold); serverEnd.After(capEnd) {
		t.Fatalf("after the clipped renewal the server lease ends at acquired+%v, after the cap, acquired+%v", serverEnd.Sub(lk.acquired), hold)
	}
	hang := make(chan struct{})
	st.mu.Lock()
	st.hang = hang
	st.mu.Unlock()
	defer close(hang)
	rec.run(t, 1000)
	if closed := rec.closed[0]; !closed.Before(serverEnd) {
		t.Fatalf("Lost() closed at acquired+%v, not before the server lease ended at acquired+%v", closed.Sub(lk.acquired), serverEnd.Sub(lk.acquired))
	}
	var le *LostError
	if err := lk.Err(); !errors.As(err, &le) || le.Reason != LossHoldCap {
		t.Fatalf("Err() = %v, want a loss at the hold cap", err)
	}
}

// A refused Release reports the lease gone (LossNotHeld: deleted, expired
// or taken), whenever its answer arrives: a reply that comes after the
// local deadline may carry a refusal decided well before it (the lease
// taken from a holder in time), which a loss at the deadline would hide.
func TestRelease_RefusedIsNotHeld_AnswerAfterDeadline(t *testing.T) {
	for _, tc := range []struct {
		name  string
		takes time.Duration
		steal bool
	}{
		{"expired on the way", 4 * time.Second, false},
		{"taken in time, slow reply", 4 * time.Second, true},
		{"taken in time", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc := newFakeClock()
			st := newClockedStore(fc)
			st.releaseTakes = tc.takes
			e := NewEngine(st)
			e.wd.clk = fc
			lk := acquireNow(t, e, "k", WithTTL(3*time.Second))
			if tc.steal {
				st.mu.Lock()
				st.owner["k"] = "someone else"
				st.mu.Unlock()
			}
			err := lk.Release(context.Background())
			var le *LostError
			if !errors.As(err, &le) || le.Reason != LossNotHeld {
				t.Fatalf("Release = %v, want a LostError with reason %q", err, LossNotHeld)
			}
			if !errors.Is(err, ErrLockLost) || !errors.Is(err, ErrNotHeld) {
				t.Fatalf("Release = %v, want it to wrap ErrLockLost and ErrNotHeld", err)
			}
		})
	}
}

// A Refresh whose client gave up at the context's deadline itself (pgx
// through a stalled PgBouncer: "timeout: context deadline exceeded")
// is no answer in time, ErrUnavailable, as when the core abandons the
// call. Symptom: a bare deadline error when the client was first.
func TestRefreshFailed_ClientsOwnDeadlineErrorIsUnavailable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	err := refreshFailed(ctx, "k", fmt.Errorf("timeout: %w", ctx.Err()))
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("refreshFailed = %v, want ErrUnavailable and the deadline", err)
	}
	// Any other error keeps its own verdict.
	other := errors.New("permission denied")
	if err := refreshFailed(context.Background(), "k", other); errors.Is(err, ErrUnavailable) || !errors.Is(err, other) {
		t.Fatalf("refreshFailed = %v, want the error as it is", err)
	}
}

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

func (*gateBackend) Spec() driver.Spec { return driver.Spec{Name: "test"} }

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

func (*notifyBackend) Spec() driver.Spec { return driver.Spec{Name: "test"} }

// LossNotifier re-entrancy does not deadlock Release: (a) a stop function
// that reports the loss synchronously (stop runs with l.mu held, lose
// takes l.mu); (b) a backend that calls lose under its own mutex while
// stop takes that mutex (ABBA: l.mu -> backend mutex in Release, backend
// mutex -> l.mu in the watch goroutine).
// Symptom: Release blocked for ever and the lock's mutex stayed held.
func TestRelease_LossNotifierReentryDoesNotDeadlock(t *testing.T) {
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

// A loss reported during Bind never hands out a lock that is lost at
// birth: TryAcquire fails, or returns a live lock.
// Symptom: TryAcquire returned success with a lock already lost.
func TestTryAcquire_LossDuringBindHandsOutNoLostLock(t *testing.T) {
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

// Lost() and Err() lose a lock whose local deadline passed themselves,
// whether or not the watchdog's timer (late with thousands of locks under
// -race on 2 cores) has fired. The test moves the clock past the deadline
// without firing the timer, to stand for one that fires late.
// Symptom: a contender was granted a key 56ms after its holder's deadline while the holder's Lost() was open.
func TestLock_LostAtDeadlineWhenWatchdogIsLate(t *testing.T) {
	for _, look := range []string{"Lost", "Err"} {
		t.Run(look, func(t *testing.T) {
			a, fc := fakeEngine(&countingBackend{})
			lk, err := a.TryAcquire(context.Background(), "k", WithTTL(MinTTL), WithAutoRefresh(false))
			if err != nil {
				t.Fatal(err)
			}
			fc.Spend(lk.Deadline().Sub(fc.Now()) + time.Millisecond)
			var lost bool
			if look == "Lost" {
				select {
				case <-lk.Lost():
					lost = true
				default:
				}
			}
			err = lk.Err()
			var le *LostError
			if !errors.As(err, &le) || le.Reason != LossDeadline {
				t.Fatalf("Err() after the deadline with the watchdog's timer stopped: %v, want a *LostError (deadline)", err)
			}
			if look == "Lost" && !lost {
				t.Fatal("Lost() open after the deadline with the watchdog's timer stopped")
			}
			select {
			case <-lk.Lost():
			default:
				t.Fatal("Lost() open after Err() reported the loss")
			}
		})
	}
}

// A Lock's Metadata is the metadata its acquisition stored, whatever it
// holds: this process's host and pid (which the Lock keeps once per
// process, not per lock), other values under those keys, or nothing.
// Symptom: a compact copy of the metadata that dropped or invented a key would show other clients one thing and the holder another.
func TestLockMetadata_RoundTrips(t *testing.T) {
	for _, md := range []map[string]string{
		{},
		{MetaHost: hostname, MetaPID: pid, MetaAcquired: "1764460800000"},
		{MetaHost: hostname, MetaPID: pid, MetaAcquired: "1", "job": "nightly"},
		{MetaHost: "other-host", MetaPID: pid, MetaAcquired: "1"},
		{MetaHost: hostname, MetaPID: "1", "x": ""},
		{MetaHost: hostname},
	} {
		l := &Lock{}
		l.meta, l.metaHostPID = metaPairs(md)
		if got := l.Metadata(); !maps.Equal(got, md) {
			t.Errorf("metadata %v came back as %v", md, got)
		}
	}
}
