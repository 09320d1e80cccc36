package dlock

import (
	"context"
	"errors"
	"fmt"
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
// be granted the key. Lost() stayed open past the server's expiry when
// the local deadline was not moved earlier by the clipped renewal and the
// cap timer had no drift allowance.
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
