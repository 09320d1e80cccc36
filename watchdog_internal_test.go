package dlock

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/background"
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
// be collected (seen with 6000 locks on a stalled link under -race).
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

// ctxLease honours its context, as a real client does: a renewal sent on
// a context that is already done fails.
type ctxLease struct{ refreshes *int64 }

func (l ctxLease) Refresh(ctx context.Context, _ time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	*l.refreshes++
	return nil
}

func (ctxLease) Release(context.Context) error { return nil }

type ctxBackend struct{ refreshes int64 }

func (b *ctxBackend) Try(context.Context, *driver.Request) (driver.Grant, error) {
	return driver.Grant{Lease: ctxLease{&b.refreshes}, Token: 1}, nil
}

func (*ctxBackend) Spec() driver.Spec { return driver.Spec{Name: "test"} }

// A renewal's context is bounded by a duration on the engine's clock:
// bounded by a clock reading handed to the wall clock, every renewal on a
// fake clock whose time is in the wall clock's past was sent on an expired
// context, and a backend that honours its context refused it.
func TestWatchdog_RenewalContextIsOnEngineClock(t *testing.T) {
	b := &ctxBackend{}
	e, fc := fakeEngine(b)
	fc.mu.Lock()
	fc.now = time.Unix(1_700_000_000, 0) // 2023: any epoch before today
	fc.mu.Unlock()
	lk := acquireNow(t, e, "k", WithTTL(300*time.Millisecond))
	defer lk.Release(context.Background())
	settleTo(t, fc, fc.Now().Add(time.Second))
	if err := lk.Err(); err != nil || b.refreshes == 0 {
		t.Fatalf("after 1s on the fake clock: %d renewals went through, Err() = %v; want the lock renewed and held", b.refreshes, err)
	}
}

// A pass that both loses a lock (a, at its deadline) and takes another
// lock's renewal (b, due at that instant), b's renewal hanging: a's Lost()
// closes by its deadline. A renewal taken in a losing round and run on
// the pass's own goroutine held a's loss until the hung call returned.
// (lossRecorder.run and settleTo wait for all background work, and b's
// hung renewal is background work: the test waits for a's loss itself.)
func TestWatchdog_HungRenewalInLosingPassDelaysNoLoss(t *testing.T) {
	fc := newFakeClock()
	st := newClockedStore(fc)
	e := NewEngine(st)
	e.wd.clk = fc
	hang := make(chan struct{})
	st.mu.Lock()
	st.hangKey["b"] = hang
	st.mu.Unlock()
	defer func() {
		close(hang)
		background.Wait(10 * time.Second)
	}()
	// b: renewed every TTL/3 = 1s; its renewal hangs.
	b := acquireNow(t, e, "b", WithTTL(3*time.Second))
	defer b.Release(context.Background())
	t0 := b.acquired
	// a: not renewed, TTL 1s, acquired its drift allowance later, so its
	// deadline is t0+1s: b's renewal time.
	const ttlA = time.Second
	fc.Spend((&config{TTL: ttlA, DriftFactor: DefaultDriftFactor, DriftMin: DefaultDriftMin}).Drift())
	a := acquireNow(t, e, "a", WithTTL(ttlA), WithAutoRefresh(false))
	if d := a.Deadline(); !d.Equal(t0.Add(time.Second)) {
		t.Fatalf("a's deadline t0+%v, want t0+1s", d.Sub(t0))
	}
	rec := recordLosses(fc, 0, []*Lock{a})
	if !fc.Step() {
		t.Fatal("no timer armed")
	}
	select {
	case <-a.life.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a's Lost() still open: its pass waits for b's hung renewal")
	}
	if worst, late := rec.late(); late > 0 {
		t.Errorf("a lost %v after its deadline", worst)
	}
	e.wd.mu.Lock()
	inflight := e.wd.locks[b] != nil && e.wd.locks[b].inflight
	e.wd.mu.Unlock()
	if !inflight {
		t.Error("b's renewal was not taken by the pass that lost a: the scenario did not happen")
	}
}

// refuseLate refuses every renewal (ErrNotHeld), once the test lets it
// answer.
type refuseLate struct {
	fc      *fakeClock
	release chan struct{}
}

func (b *refuseLate) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	return driver.Grant{Lease: refuseLateLease{b}, Token: 1}, nil
}

func (*refuseLate) Spec() driver.Spec { return driver.Spec{Name: "test"} }

type refuseLateLease struct{ b *refuseLate }

func (l refuseLateLease) Refresh(ctx context.Context, ttl time.Duration) error {
	l.b.fc.Park()
	<-l.b.release
	return ErrNotHeld
}

func (refuseLateLease) Release(context.Context) error { return nil }

// A renewal refused (ErrNotHeld) is a loss by the server when the refusal
// comes before the local deadline, and a loss at the deadline when it
// comes after it: the server then ended a lease the holder had already
// given up, and a starved watchdog had not said so yet. Symptom: reported
// as the server taking the lease away, which a holder must never see
// before its deadline.
func TestWatchdog_RefusalAfterDeadlineIsLossAtDeadline(t *testing.T) {
	for _, late := range []bool{false, true} {
		b := &refuseLate{release: make(chan struct{})}
		e, fc := fakeEngine(b)
		b.fc = fc
		lk := acquireNow(t, e, "k", WithTTL(300*time.Millisecond))
		// The renewal is sent at TTL/3 (a little early) and parks.
		fc.AdvanceTo(lk.acquired.Add(100 * time.Millisecond))
		if late {
			fc.Spend(lk.Deadline().Sub(fc.Now()) + time.Millisecond)
		}
		close(b.release)
		select {
		case <-lk.life.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("late=%v: the refused renewal did not lose the lock", late)
		}
		want := LossNotHeld
		if late {
			want = LossDeadline
		}
		var le *LostError
		if err := lk.Err(); !errors.As(err, &le) || le.Reason != want {
			t.Errorf("late=%v: Err() = %v, want a loss for reason %v", late, err, want)
		}
		if !background.Wait(10 * time.Second) {
			t.Fatal("background work did not end")
		}
	}
}

// A manual Refresh whose success lands while a watchdog pass that already
// counted the lock as expired (took it out of the heap) is about to lose
// it: the pass finds the deadline moved and keeps the new one watched.
// The test runs the pass's steps itself, on a fake clock, in the order
// that interleaving takes.
// Symptom: nothing re-armed the timer, and Lost() stayed open while the server lease expired.
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
