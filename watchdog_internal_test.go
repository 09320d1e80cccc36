package dlock

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// countingBackend grants every attempt and counts renewals.
type countingBackend struct{ refreshes atomic.Int64 }

func (b *countingBackend) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	return driver.Grant{Lease: countingLease{b}, Token: 1}, nil
}

type countingLease struct{ b *countingBackend }

func (l countingLease) Refresh(context.Context, time.Duration) error {
	l.b.refreshes.Add(1)
	return nil
}
func (l countingLease) Release(context.Context) error { return nil }

// After the timer was seen very late (a process paused for seconds), the
// watchdog arms and loses early by at most a tenth of a TTL, and does not
// spin: a lock due for renewal is renewed, not re-examined in a loop.
func TestWatchdog_LatenessDoesNotSpin(t *testing.T) {
	b := &countingBackend{}
	a, fc := fakeEngine(b)
	a.wd.noteLateness(10 * time.Second)
	lk, err := a.TryAcquire(context.Background(), "k", WithTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	passes := a.wd.passes.Load()
	settleTo(t, fc, fc.Now().Add(time.Second))
	if err := lk.Err(); err != nil {
		t.Fatalf("lock lost: %v", err)
	}
	// Renewals every TTL/3 = 100ms after the last, up to a tenth of the
	// TTL early (70-100ms apart): 10 to 15 in a second, a pass each.
	n, p := b.refreshes.Load(), a.wd.passes.Load()-passes
	if n < 10 || n > 15 || p > n+1 {
		t.Fatalf("%d renewals in %d passes in 1s with a 300ms TTL, want 10-15 in as many passes", n, p)
	}
}

// Locks sharing one deadline (a renewal batch gives all its locks the same
// one) make the timer fire early by the measured cost of losing them all,
// bounded by a tenth of the TTL; and a round loses at most maxRoundLosses
// of them, so the first ones' Lost() does not wait for the whole batch to
// be collected (red team, 6000 locks on a stalled link under -race).
func TestSharedDeadlineLeadsAndRoundsAreBounded(t *testing.T) {
	a := NewEngine(&countingBackend{})
	w := a.wd
	const n, ttl = 1000, 10 * time.Second
	var locks []*Lock
	for i := 0; i < n; i++ {
		lk, err := a.TryAcquire(context.Background(), fmt.Sprint("k", i), WithTTL(ttl), WithAutoRefresh(false))
		if err != nil {
			t.Fatal(err)
		}
		locks = append(locks, lk)
	}
	defer func() {
		for _, lk := range locks {
			lk.Release(context.Background())
		}
	}()
	w.loseCost.Store(int64(20 * time.Microsecond))
	w.lateness.Store(0)
	// Give every lock one deadline, as a renewal batch does.
	d := time.Now().Add(time.Hour)
	w.mu.Lock()
	for _, e := range w.locks {
		w.shareLocked(e, d)
		w.fixLocked(e)
	}
	w.timerAt = time.Time{}
	w.armForLocked(w.queue[0])
	at, lead := w.timerAt, w.timerLead
	w.mu.Unlock()
	// 1000 x 20us x costMargin, plus at most the millisecond the deadline's bucket
	// starts before it.
	if want := 20 * time.Millisecond * costMargin; lead < want || lead > want+time.Millisecond || !at.Equal(d.Add(-lead)) {
		t.Fatalf("timer armed %v before the shared deadline (lead %v), want %v", d.Sub(at), lead, want)
	}
	// Past the cap: a quarter of the TTL.
	w.loseCost.Store(int64(10 * time.Millisecond))
	w.mu.Lock()
	w.timerAt = time.Time{}
	w.armForLocked(w.queue[0])
	lead = w.timerLead
	w.mu.Unlock()
	if cap := ttl / maxLeadDiv; lead < cap || lead > cap+time.Millisecond {
		t.Fatalf("lead %v, want the cap %v", lead, ttl/maxLeadDiv)
	}
	// A round collects at most maxRoundLosses, even when all are due.
	past := time.Now().Add(-time.Second)
	for _, lk := range locks {
		lk.mu.Lock()
		lk.deadline = past
		lk.mu.Unlock()
	}
	w.mu.Lock()
	for _, e := range w.locks {
		w.shareLocked(e, past)
		w.fixLocked(e)
	}
	w.mu.Unlock()
	var fired passLead
	var due []*Lock
	expired, at2, more := w.collect(true, false, &fired, &due)
	if len(expired) != maxRoundLosses || !more || len(at2) != len(expired) {
		t.Fatalf("a round collected %d locks (more %v), want %d", len(expired), more, maxRoundLosses)
	}
	// While the pass loops it takes what is due itself: the timer is not
	// armed for a lock already due (that started a pass per round, and
	// the passes fought over w.mu), not even by a renewal's report.
	w.mu.Lock()
	w.armForLocked(w.queue[0])
	armed := w.timerAt
	w.mu.Unlock()
	if !armed.IsZero() && !armed.After(time.Now()) {
		t.Fatalf("timer armed for %v (a lock already due) while a pass is losing the locks due", armed)
	}
	cleanupAll(loseAll(w, expired, at2))
	for _, lk := range expired {
		if lk.Err() == nil {
			t.Fatal("a collected lock was not lost")
		}
	}
	// The pass's next rounds lose the rest, as pass does; then no lock
	// counts towards any deadline's sharing, and the loop is over.
	for more {
		expired, at2, more = w.collect(false, false, &fired, &due)
		if len(expired) > maxRoundLosses {
			t.Fatalf("a round collected %d locks", len(expired))
		}
		cleanupAll(loseAll(w, expired, at2))
	}
	for _, lk := range locks {
		select {
		case <-lk.Lost():
		case <-time.After(10 * time.Second):
			t.Fatal("hang: a lock past its deadline was not lost")
		}
	}
	w.mu.Lock()
	left, looping := len(w.sharing), w.looping
	w.mu.Unlock()
	if left != 0 || looping != 0 {
		t.Fatalf("sharing still counts %d deadlines; %d passes looping", left, looping)
	}
}

// loseAll is lose plus what pass does after its loop.
func loseAll(w *watchdog, expired []*Lock, at []time.Time) []*Lock {
	cleanups, unbinds, lost := w.lose(expired, at, nil, nil, nil)
	for _, stop := range unbinds {
		stop()
	}
	for _, l := range lost {
		l.reportLost()
	}
	return cleanups
}

func (*countingBackend) Spec() driver.Spec { return driver.Spec{Name: "test"} }

// A renewal stuck in a client that ignores contexts must not hold up the
// watchdog: the holder's Lost() closes by its deadline, before the server
// lease ends and anyone else can hold the key. The holder learned of the
// loss seconds after another client held the key.
func TestWatchdog_HungRenewalLosesByDeadline(t *testing.T) {
	fc := newFakeClock()
	st := newClockedStore(fc)
	e := NewEngine(st)
	e.wd.clk = fc
	lk := acquireNow(t, e, "k", WithTTL(300*time.Millisecond))
	hang := make(chan struct{})
	st.mu.Lock()
	st.hang = hang
	st.mu.Unlock()
	defer close(hang)
	end := st.expiry("k") // no renewal lands from now on
	rec := recordLosses(fc, 0, []*Lock{lk})
	rec.run(t, 100)
	if !rec.closed[0].Before(end) {
		t.Fatalf("Lost() closed %v after the server lease ended", rec.closed[0].Sub(end))
	}
	var le *LostError
	if !errors.As(lk.Err(), &le) || le.Reason != LossDeadline {
		t.Fatalf("Err() = %v, want a loss at the deadline", lk.Err())
	}
}

// A lock taken while another lock's renewal hangs is renewed and watched
// as usual: it was neither renewed nor deadline-checked until the hung
// renewal returned.
func TestWatchdog_LockTakenDuringHungRenewalIsRenewed(t *testing.T) {
	fc := newFakeClock()
	st := newClockedStore(fc)
	e := NewEngine(st)
	e.wd.clk = fc
	const ttl = 300 * time.Millisecond
	a := acquireNow(t, e, "a", WithTTL(ttl))
	hang := make(chan struct{})
	st.mu.Lock()
	st.hangKey["a"] = hang
	st.mu.Unlock()
	defer close(hang)
	// a's first renewal is sent, and hangs.
	settleTo(t, fc, a.acquired.Add(ttl/3))
	b := acquireNow(t, e, "b", WithTTL(ttl))
	defer b.Release(context.Background())
	settleTo(t, fc, fc.Now().Add(4*ttl))
	if err := a.Err(); err == nil {
		t.Fatal("a, its renewal hung, outlived its deadline")
	}
	if err := b.Err(); err != nil {
		t.Fatalf("b was lost while a's renewal hung: %v", err)
	}
	st.mu.Lock()
	n, owner := st.renews["b"], st.owner["b"]
	st.mu.Unlock()
	// A renewal every TTL/3 (a little early): at least 12 in 4 TTLs.
	if n < 12 || owner != b.Owner() {
		t.Fatalf("b renewed %d times in 4 TTLs (server owner %q), want at least 12 and held", n, owner)
	}
}
