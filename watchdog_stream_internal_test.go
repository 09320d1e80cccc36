package dlock

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/background"
)

// The scenarios here put thousands of deadlines on one watchdog and
// check, on a clock the test moves (fakeClock), that every lock's Lost()
// closes by its local deadline. Losing a lock costs the watchdog CPU, so
// each loss moves the clock on by a fixed cost (lossRecorder): the
// watchdog must start early enough to lose a whole stream in time. What
// the tests see depends only on the watchdog's decisions, not on how fast
// the machine runs them.

// startBackend grants every key with the Start set for it (zero: the
// attempt's start), so a test chooses each lock's deadline; renewals
// succeed.
type startBackend struct {
	mu    sync.Mutex
	start map[string]time.Time
}

func newStartBackend() *startBackend { return &startBackend{start: map[string]time.Time{}} }

func (b *startBackend) setStart(key string, t time.Time) {
	b.mu.Lock()
	b.start[key] = t
	b.mu.Unlock()
}

func (b *startBackend) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	b.mu.Lock()
	s := b.start[req.Key]
	b.mu.Unlock()
	return driver.Grant{Lease: nopLease{}, Token: 1, Start: s}, nil
}

func (*startBackend) Spec() driver.Spec { return driver.Spec{Name: "test"} }

type nopLease struct{}

func (nopLease) Refresh(context.Context, time.Duration) error { return nil }
func (nopLease) Release(context.Context) error                { return nil }

// fakeEngine is an Engine over b whose locks run on a fake clock.
func fakeEngine(b driver.Driver) (*Engine, *fakeClock) {
	e := NewEngine(b)
	fc := newFakeClock()
	e.wd.clk = fc
	return e, fc
}

// lossRecorder records, per lock, the clock's reading when its Lost()
// closed, and moves the clock on by cost for each loss: the CPU time
// losing a lock takes.
type lossRecorder struct {
	fc       *fakeClock
	cost     time.Duration
	mu       sync.Mutex
	locks    []*Lock
	deadline []time.Time
	closed   []time.Time
	left     int
}

func recordLosses(fc *fakeClock, cost time.Duration, locks []*Lock) *lossRecorder {
	r := &lossRecorder{fc: fc, cost: cost, locks: append([]*Lock(nil), locks...), left: len(locks)}
	r.deadline = make([]time.Time, len(locks))
	r.closed = make([]time.Time, len(locks))
	for i, l := range r.locks {
		l.mu.Lock()
		r.deadline[i] = l.deadline
		orig := l.cancel
		l.cancel = func(c error) {
			r.fc.Spend(r.cost)
			r.mu.Lock()
			if r.closed[i].IsZero() {
				r.closed[i] = r.fc.Now()
				r.left--
			}
			r.mu.Unlock()
			orig(c)
		}
		l.mu.Unlock()
	}
	return r
}

func (r *lossRecorder) done() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.left == 0
}

// run fires the clock's timers, in order, until every recorded lock is
// lost (or maxSteps timers fired), letting the background work each pass
// starts end before the next; it returns the timers fired.
func (r *lossRecorder) run(t *testing.T, maxSteps int) int {
	t.Helper()
	steps := 0
	for !r.done() && steps < maxSteps {
		if !r.fc.Step() {
			break
		}
		steps++
		if !background.Wait(10 * time.Second) {
			t.Fatal("hang: a pass's background work did not end")
		}
	}
	if !r.done() {
		t.Fatalf("%d locks still held after %d timer firings", r.left, steps)
	}
	return steps
}

// late reports the latest loss relative to its lock's deadline (positive:
// after it) and how many locks were lost after their deadline.
func (r *lossRecorder) late() (worst time.Duration, n int) {
	worst = -time.Hour
	for i := range r.locks {
		d := r.closed[i].Sub(r.deadline[i])
		worst = max(worst, d)
		if d > 0 {
			n++
		}
	}
	return worst, n
}

// settleTo moves fc to at, firing each timer due on the way and letting
// the background work its function started (renewals, cleanups) end
// before the next: what the watchdog does then depends on the clock only.
func settleTo(t *testing.T, fc *fakeClock, at time.Time) {
	t.Helper()
	for i := 0; ; i++ {
		next, ok := fc.pending()
		if !ok || next.After(at) {
			break
		}
		if i == 100000 {
			t.Fatal("timers keep firing: the watchdog spins")
		}
		fc.Step()
		if !background.Wait(10 * time.Second) {
			t.Fatal("hang: background work did not end")
		}
	}
	fc.AdvanceTo(at)
}

func acquireNow(t *testing.T, e *Engine, key string, opts ...Option) *Lock {
	t.Helper()
	lk, err := e.TryAcquire(context.Background(), key, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return lk
}

// batchAt acquires n locks of TTL ttl whose deadline (with the drift
// allowance) is d plus i*spread for the i-th, without auto-refresh.
func batchAt(t *testing.T, e *Engine, b *startBackend, n int, ttl time.Duration, d time.Time, spread time.Duration) []*Lock {
	t.Helper()
	drift := (&config{TTL: ttl, DriftFactor: DefaultDriftFactor, DriftMin: DefaultDriftMin}).Drift()
	locks := make([]*Lock, n)
	for i := range locks {
		k := fmt.Sprint("k", i)
		b.setStart(k, d.Add(-(ttl - drift)).Add(time.Duration(i)*spread))
		locks[i] = acquireNow(t, e, k, WithTTL(ttl), WithAutoRefresh(false))
	}
	return locks
}

// lossCost is the CPU time losing one lock takes in these scenarios (as
// measured under -race: 10-48us), and the estimate the watchdog starts
// from.
const lossCost = 40 * time.Microsecond

// maxPassesPerBatch bounds the passes losing one batch may take: a timer
// re-armed in the past fires again at once, pass after pass (spinning).
const maxPassesPerBatch = 200

// A short-TTL lock at the heap root, 1ms before a big shared deadline of
// long-TTL locks, capped the pass's lead at the short lock's TTL/4, so
// the batch behind it was lost late (12000 locks: up to 216ms late). The
// cap is per deadline millisecond, by the longest TTL counted there.
func TestWatchdog_BatchLostByDeadline_ShortLockAtRoot(t *testing.T) {
	b := newStartBackend()
	e, fc := fakeEngine(b)
	e.wd.loseCost.Store(int64(lossCost))
	const n, ttl = 12000, 10 * time.Second
	D := fc.Now().Add(3 * time.Second)
	batch := batchAt(t, e, b, n, ttl, D, 0)
	if !batch[0].Deadline().Equal(D) {
		t.Fatalf("deadline %v, want %v", batch[0].Deadline(), D)
	}
	rec := recordLosses(fc, lossCost, batch)
	// The short lock: TTL 1s, drift 20ms, deadline start+980ms = D-1ms.
	sb := D.Add(-981 * time.Millisecond)
	fc.AdvanceTo(sb)
	b.setStart("short", sb)
	short := acquireNow(t, e, "short", WithTTL(time.Second), WithAutoRefresh(false))
	if d := short.Deadline(); !d.Equal(D.Add(-time.Millisecond)) {
		t.Fatalf("short lock's deadline D%v, want D-1ms", d.Sub(D))
	}
	e.wd.mu.Lock()
	lead := D.Sub(e.wd.timerAt)
	e.wd.mu.Unlock()
	// The timer leads the batch's deadline by what losing it takes at the
	// estimated cost (the short lock's own cap, 250ms, is not the batch's).
	if want := time.Duration(n) * lossCost; lead < want {
		t.Errorf("timer armed %v before the batch's deadline, want at least %v (n x cost)", lead, want)
	}
	passes := e.wd.passes.Load()
	rec.run(t, 100000)
	worst, late := rec.late()
	if p := e.wd.passes.Load() - passes; p > maxPassesPerBatch {
		t.Errorf("%d passes while one batch was lost: the timer spins", p)
	}
	if late > 0 {
		t.Errorf("%d batch locks lost after their deadline, the latest by %v", late, worst)
	}
	// The short lock, set aside while the batch was lost, is lost by
	// its own deadline.
	sr := recordLosses(fc, lossCost, []*Lock{short})
	sr.run(t, 1000)
	if worst, late := sr.late(); late > 0 {
		t.Errorf("the short lock was lost %v after its deadline", worst)
	}
}

// An auto-refreshed lock whose renewal falls just before a big shared
// deadline, after any earlier pass (here a lone lock's deadline), got the
// timer armed for the renewal only, forgetting the batch's stream lead
// (8000 locks lost up to 245ms late). The stream is read from the root's
// due time, whatever it is due for.
func TestWatchdog_BatchLostByDeadline_RenewalAtRoot(t *testing.T) {
	b := newStartBackend()
	e, fc := fakeEngine(b)
	e.wd.loseCost.Store(int64(lossCost))
	const n, ttl = 8000, 10 * time.Second
	D := fc.Now().Add(2500 * time.Millisecond)
	batch := batchAt(t, e, b, n, ttl, D, 0)
	// A: TTL 6s, auto-refreshed, renewal due at start+2s = D-5ms.
	fc.AdvanceTo(D.Add(-2004 * time.Millisecond))
	b.setStart("A", D.Add(-2005*time.Millisecond))
	A := acquireNow(t, e, "A", WithTTL(6*time.Second))
	defer A.Release(context.Background())
	if d := A.Deadline().Sub(D); d != 6*time.Second-70*time.Millisecond-2005*time.Millisecond {
		t.Fatalf("A's start not honoured: deadline D+%v", d)
	}
	// C: a lone lock due 600ms before D (its pass then re-arms for the
	// root, A's renewal).
	b.setStart("C", D.Add(-600*time.Millisecond).Add(-(ttl - 110*time.Millisecond)))
	C := acquireNow(t, e, "C", WithTTL(ttl), WithAutoRefresh(false))
	recordLosses(fc, lossCost, []*Lock{C}).run(t, 1000)
	rec := recordLosses(fc, lossCost, batch)
	rec.run(t, 100000)
	if worst, late := rec.late(); late > 0 {
		t.Errorf("%d batch locks lost after their deadline, the latest by %v", late, worst)
	}
	if err := A.Err(); err != nil {
		t.Errorf("A, renewed, was lost: %v", err)
	}
}

// A spread stream of long-TTL deadlines (20us apart, about what losing
// each costs) behind a short-TTL lock at the root: a pass that ran ahead
// of the stream re-armed by the short lock's own lead and lost the rest up
// to 27ms late. The pass sets the short lock aside and works through the
// stream from the lead the timer was armed with.
func TestWatchdog_SpreadStreamLostByDeadline_ShortLockAtRoot(t *testing.T) {
	b := newStartBackend()
	e, fc := fakeEngine(b)
	e.wd.loseCost.Store(int64(lossCost))
	const n, ttl = 12000, 10 * time.Second
	D := fc.Now().Add(3 * time.Second)
	batch := batchAt(t, e, b, n, ttl, D, 20*time.Microsecond)
	rec := recordLosses(fc, lossCost, batch)
	sb := D.Add(-981 * time.Millisecond)
	fc.AdvanceTo(sb)
	b.setStart("short", sb)
	acquireNow(t, e, "short", WithTTL(time.Second), WithAutoRefresh(false))
	passes := e.wd.passes.Load()
	rec.run(t, 100000)
	p := e.wd.passes.Load() - passes
	if worst, late := rec.late(); late > 0 || p > maxPassesPerBatch {
		t.Errorf("stream: %d locks lost after their deadline (the latest by %v), in %d passes", late, worst, p)
	}
}

// hungRenewals grants every key (the server lease ends a TTL after the
// grant, on the clock) and hangs every renewal batch, ignoring its
// context, until release is closed: a client on a stalled link.
type hungRenewals struct {
	fc      *fakeClock
	release chan struct{}
	mu      sync.Mutex
	expires map[string]time.Time
}

func (b *hungRenewals) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	b.mu.Lock()
	b.expires[req.Key] = b.fc.Now().Add(req.TTL)
	b.mu.Unlock()
	return driver.Grant{Lease: nopLease{}, Token: 1}, nil
}

func (b *hungRenewals) RefreshBatch(ctx context.Context, rs []driver.Renewal, done func(int, error)) {
	b.fc.Park()
	<-b.release
}

func (*hungRenewals) Spec() driver.Spec { return driver.Spec{Name: "test"} }

// Thousands of auto-refreshed locks whose renewals hang: each lock's
// Lost() closes by its local deadline, so before its lease can expire on
// the server. A scan of every lock per watchdog pass and a goroutine per
// lost lock made 3000 locks lose theirs after the server lease ended.
func TestWatchdog_HungRenewalsLostBeforeServerExpiry(t *testing.T) {
	fc := newFakeClock()
	b := &hungRenewals{fc: fc, release: make(chan struct{}), expires: map[string]time.Time{}}
	e := NewEngine(b)
	e.wd.clk = fc
	const n, ttl = 3000, time.Second
	locks := make([]*Lock, n)
	for i := range locks {
		// Acquired over 300ms, as a busy service would.
		fc.Advance(100 * time.Microsecond)
		locks[i] = acquireNow(t, e, fmt.Sprint("k", i), WithTTL(ttl))
	}
	defer func() {
		close(b.release)
		background.Wait(10 * time.Second)
	}()
	rec := recordLosses(fc, lossCost, locks)
	passes := e.wd.passes.Load()
	rec.run(t, 100000)
	// About a pass per deadline millisecond (300) and per renewal batch;
	// a timer re-armed in the past would fire pass after pass.
	if p := e.wd.passes.Load() - passes; p > 1000 {
		t.Errorf("%d passes to lose %d locks spread over 300ms: the timer spins", p, n)
	}
	if worst, late := rec.late(); late > 0 {
		t.Errorf("%d locks lost after their local deadline, the latest by %v", late, worst)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, lk := range locks {
		if exp := b.expires[lk.Key()]; !rec.closed[i].Before(exp) {
			t.Fatalf("lock %d: Lost() closed %v after its server lease ended", i, rec.closed[i].Sub(exp))
		}
	}
}

// The stream's counts read millisecond by millisecond and read as the
// sorted list of tracked milliseconds give the same lead, whatever the
// counts, TTLs, lateness and window.
// Symptom: each re-arm after a renewal looked up every millisecond of its window: 20 000 locks renewed in one batch cost 20 million map reads a tick.
func TestStreamScan_SparseReadMatchesEveryMillisecond(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	base := time.Unix(1_800_000_000, 0)
	for i := 0; i < 2000; i++ {
		w := &watchdog{sharing: map[int64]share{}}
		from := base.Add(time.Duration(rng.IntN(1000)) * time.Microsecond)
		for range rng.IntN(40) {
			b := deadlineBucket(from) + int64(rng.IntN(1500)) - 100
			sh := w.sharing[b]
			sh.n += 1 + rng.IntN(5000)
			sh.maxTTL = max(sh.maxTTL, time.Duration(1+rng.IntN(60))*time.Second)
			w.sharing[b] = sh
		}
		late := time.Duration(rng.IntN(50)) * time.Millisecond
		cost := time.Duration(1+rng.IntN(100)) * time.Microsecond
		lead := min(late, time.Duration(1+rng.IntN(30))*time.Second/10)
		steps := int64(rng.IntN(maxLeadScan + 1))
		l1, u1 := w.streamScanLocked(from, lead, late, cost, steps, true)
		l2, u2 := w.streamScanLocked(from, lead, late, cost, steps, false)
		if l1 != l2 || !u1.Equal(u2) {
			t.Fatalf("case %d: sparse read %v until %v, every millisecond %v until %v", i, l1, u1, l2, u2)
		}
	}
}
