package dlock_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/guard"
	"github.com/dlock-go/dlock/internal/observe"
	"github.com/dlock-go/dlock/memlock"
)

func kinds(ev []dlock.Event) string {
	var s []string
	for _, e := range ev {
		k := e.Kind.String()
		if e.Result != "" {
			k += ":" + string(e.Result)
		}
		if e.Reason != "" {
			k += ":" + string(e.Reason)
		}
		s = append(s, k)
	}
	return strings.Join(s, " ")
}

func TestObserverSeesTheLifeOfALock(t *testing.T) {
	rec := &dlocktest.Recorder{}
	l := memlock.New(dlock.WithObserver(rec))
	other := l
	ctx := ctxT(t)

	lk, err := l.Acquire(ctx, "k", dlock.WithTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := kinds(rec.Take()), "wait attempt acquire:acquired"; got != want {
		t.Fatalf("acquire events %q, want %q", got, want)
	}
	if _, err := other.TryAcquire(ctx, "k"); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatal(err)
	}
	if got, want := kinds(rec.Take()), "wait attempt acquire:contended"; got != want {
		t.Fatalf("contended events %q, want %q", got, want)
	}
	if _, err := other.Acquire(ctx, "k", dlock.WithWait(30*time.Millisecond)); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatal(err)
	}
	ev := rec.Take()
	if last := ev[len(ev)-1]; last.Kind != dlock.EventAcquire || last.Result != dlock.ResultTimeout || last.Wait < 30*time.Millisecond || last.Attempts < 2 {
		t.Fatalf("timed-out wait reported %+v", last)
	}
	if err := lk.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := kinds(rec.Take()), "renew:ok"; got != want {
		t.Fatalf("refresh events %q, want %q", got, want)
	}
	l.Expire("k")
	select {
	case <-lk.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("not lost after the lease was deleted")
	}
	// EventLost is reported once Lost() is closed, so it may come a moment
	// after the receive above.
	ev = rec.Take()
	for end := time.Now().Add(time.Second); !strings.Contains(kinds(ev), "lost") && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
		ev = append(ev, rec.Take()...)
	}
	if got := kinds(ev); !strings.HasSuffix(got, "renew:refused lost:not_held") {
		t.Fatalf("loss events %q, want a refused renewal then lost:not_held", got)
	}
	if e := ev[len(ev)-1]; e.Token != lk.Token() || e.Owner != lk.Owner() || e.Key != "k" || e.Backend != "memory" || e.Held <= 0 {
		t.Fatalf("lost event %+v", e)
	}
	var le *dlock.LostError
	if !errors.As(lk.Err(), &le) || le.Reason != dlock.LossNotHeld {
		t.Fatalf("Err() = %v, want a LostError with reason not_held", lk.Err())
	}

	lk2, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	rec.Take()
	if err := lk2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	_ = lk2.Release(ctx) // a second release reports nothing more
	if got, want := kinds(rec.Take()), "release"; got != want {
		t.Fatalf("release events %q, want %q", got, want)
	}

	if _, err := l.Acquire(ctx, ""); err == nil {
		t.Fatal("empty key accepted")
	}
	if got, want := kinds(rec.Take()), "wait acquire:error"; got != want {
		t.Fatalf("bad-input events %q, want %q", got, want)
	}
}

func TestSlogObserver(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	l := memlock.New(dlock.WithObserver(dlock.NewSlogObserver(logger)))
	lk, err := l.Acquire(context.Background(), "jobs/nightly")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = l.TryAcquire(context.Background(), "jobs/nightly")
	_ = lk.Release(context.Background())
	out := buf.String()
	for _, want := range []string{"msg=lock_acquire_attempt", "msg=lock_acquired", "msg=lock_failed", "result=contended", "msg=lock_released", "backend=memory", "key=jobs/nightly"} {
		if !strings.Contains(out, want) {
			t.Errorf("slog output lacks %q:\n%s", want, out)
		}
	}
	dlock.NewSlogObserver(nil).Observe(dlock.Event{Kind: dlock.EventRejected}) // nil logger: slog.Default, no panic
}

// waitKinds collects rec's events until their kinds end with suffix (an
// EventLost comes a moment after Lost() closes), for at most 5s.
func waitKinds(t *testing.T, rec *dlocktest.Recorder, suffix string) string {
	t.Helper()
	return kinds(waitEvents(t, rec, suffix))
}

// waitEvents is waitKinds returning the events.
func waitEvents(t *testing.T, rec *dlocktest.Recorder, suffix string) []dlock.Event {
	t.Helper()
	var ev []dlock.Event
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		ev = append(ev, rec.Take()...)
		if strings.HasSuffix(kinds(ev), suffix) {
			return ev
		}
	}
	t.Fatalf("events %q, want them to end with %q", kinds(ev), suffix)
	return nil
}

func TestCallObserverSeesItsCallAndItsLock(t *testing.T) {
	var all, call dlocktest.Recorder
	l := memlock.New(dlock.WithObserver(&all))
	ctx := ctxT(t)

	lk, err := l.Acquire(ctx, "k", dlock.WithTTL(time.Second), dlock.WithCallObserver(&call))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := kinds(call.Take()), "wait attempt acquire:acquired"; got != want {
		t.Fatalf("call observer: acquire events %q, want %q", got, want)
	}
	// Another call, without the option: not reported to this call's
	// observer, whatever it does to the key.
	if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatal(err)
	}
	other, err := l.TryAcquire(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if ev := call.Take(); len(ev) != 0 {
		t.Fatalf("call observer saw other calls' events: %q", kinds(ev))
	}

	if err := lk.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	ev := call.Take()
	if got, want := kinds(ev), "renew:ok release"; got != want {
		t.Fatalf("call observer: lock events %q, want %q", got, want)
	}
	for _, e := range ev {
		if e.Backend != "memory" || e.Key != "k" || e.Token != lk.Token() || e.Owner != lk.Owner() {
			t.Fatalf("lock event %+v does not name the lock (token %d, owner %s)", e, lk.Token(), lk.Owner())
		}
	}
	// The Locker's Observer still sees everything: three calls, the
	// refreshes and releases.
	if got := kinds(all.Take()); strings.Count(got, "acquire:") != 3 || strings.Count(got, "renew:ok") != 2 || strings.Count(got, "release") != 2 {
		t.Fatalf("locker observer saw %q", got)
	}
}

func TestCallObserverSeesTheLoss(t *testing.T) {
	var call dlocktest.Recorder
	l := memlock.New()
	ctx := ctxT(t)
	lk, err := l.Acquire(ctx, "k", dlock.WithTTL(time.Second), dlock.WithAutoRefresh(false), dlock.WithCallObserver(&call))
	if err != nil {
		t.Fatal(err)
	}
	call.Take()
	l.Expire("k")
	if err := lk.Refresh(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("refresh after expiry: %v, want ErrLockLost", err)
	}
	waitKinds(t, &call, "renew:refused lost:not_held")
	if err := lk.Release(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("release after loss: %v", err)
	}
	if ev := call.Take(); len(ev) != 0 {
		t.Fatalf("events after the loss: %q (a lost lock's release reports nothing)", kinds(ev))
	}
}

func TestCallObserverContendedAndTimeout(t *testing.T) {
	var call dlocktest.Recorder
	l := memlock.New()
	ctx := ctxT(t)
	lk, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(ctx)
	if _, err := l.TryAcquire(ctx, "k", dlock.WithCallObserver(&call)); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatal(err)
	}
	if got, want := kinds(call.Take()), "wait attempt acquire:contended"; got != want {
		t.Fatalf("contended: %q, want %q", got, want)
	}
	if _, err := l.Acquire(ctx, "k", dlock.WithWait(30*time.Millisecond), dlock.WithCallObserver(&call)); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatal(err)
	}
	last, ok := call.Last(dlock.EventAcquire)
	if !ok || last.Result != dlock.ResultTimeout || last.Attempts < 2 || last.Wait < 30*time.Millisecond {
		t.Fatalf("timed-out wait reported %+v", last)
	}
}

func TestCallObserverOnRefusedCalls(t *testing.T) {
	l := memlock.New()
	for name, call := range map[string]func(o dlock.Option) error{
		"nil context": func(o dlock.Option) error {
			var nilCtx context.Context // the bad input under test
			_, err := l.Acquire(nilCtx, "k", o)
			return err
		},
		"bad key": func(o dlock.Option) error {
			_, err := l.TryAcquire(context.Background(), "", o)
			return err
		},
		"bad ttl": func(o dlock.Option) error {
			_, err := l.TryAcquire(context.Background(), "k", dlock.WithTTL(time.Nanosecond), o)
			return err
		},
	} {
		var rec dlocktest.Recorder
		if err := call(dlock.WithCallObserver(&rec)); err == nil {
			t.Fatalf("%s: no error", name)
		}
		ev := rec.Take()
		if got, want := kinds(ev), "wait acquire:error"; got != want {
			t.Fatalf("%s: %q, want %q", name, got, want)
		}
		if ev[1].Err == nil || ev[1].Backend != "memory" {
			t.Fatalf("%s: %+v", name, ev[1])
		}
	}
}

func TestCallObserverNilAndPanicking(t *testing.T) {
	var all dlocktest.Recorder
	l := memlock.New(dlock.WithObserver(&all))
	ctx := ctxT(t)
	var nilRec *dlocktest.Recorder
	var panics int
	var mu sync.Mutex
	boom := dlock.ObserverFunc(func(dlock.Event) {
		mu.Lock()
		panics++
		mu.Unlock()
		panic("observer bug")
	})
	lk, err := l.Acquire(ctx, "k",
		dlock.WithCallObserver(nil),
		dlock.WithCallObserver(dlock.ObserverFunc(nil)),
		dlock.WithCallObserver(nilRec),
		dlock.WithCallObserver(boom))
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := kinds(all.Take()), "wait attempt acquire:acquired renew:ok release"; got != want {
		t.Fatalf("locker observer: %q, want %q (a panicking call observer must not cut it short)", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if panics != 5 {
		t.Fatalf("the panicking observer was called %d times, want 5", panics)
	}
}

func TestCallObserverOrderAndSeveral(t *testing.T) {
	var mu sync.Mutex
	var order []string
	rec := func(name string) dlock.Observer {
		return dlock.ObserverFunc(func(e dlock.Event) {
			mu.Lock()
			order = append(order, name+":"+e.Kind.String())
			mu.Unlock()
		})
	}
	l := memlock.New(dlock.WithObserver(rec("locker")))
	ctx := ctxT(t)
	lk, err := l.TryAcquire(ctx, "k", dlock.WithCallObserver(rec("a")), dlock.WithCallObserver(rec("b")))
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	got := strings.Join(order, " ")
	want := "locker:wait a:wait b:wait locker:attempt a:attempt b:attempt locker:acquire a:acquire b:acquire locker:release a:release b:release"
	if got != want {
		t.Fatalf("order %q, want %q", got, want)
	}
}

// Helpers that acquire on the caller's behalf pass the option on: each
// acquisition reports to the call's observer.
func TestCallObserverThroughHelpers(t *testing.T) {
	l := memlock.New()
	ctx := ctxT(t)
	var rec dlocktest.Recorder
	set, err := dlock.AcquireAll(ctx, l, []string{"b", "a"}, dlock.WithCallObserver(&rec))
	if err != nil {
		t.Fatal(err)
	}
	if err := set.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := kinds(rec.Take()); strings.Count(got, "acquire:acquired") != 2 || strings.Count(got, "release") != 2 {
		t.Fatalf("AcquireAll: %q", got)
	}
	err = dlock.Do(ctx, l, "k", func(context.Context, *dlock.Lock) error { return nil }, dlock.WithCallObserver(&rec))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := kinds(rec.Take()), "wait attempt acquire:acquired release"; got != want {
		t.Fatalf("Do: %q, want %q", got, want)
	}
	ran, err := dlock.RunOnce(ctx, l, "job", time.Second, 0, func(context.Context) error { return nil }, dlock.WithCallObserver(&rec))
	if !ran || err != nil {
		t.Fatal(ran, err)
	}
	if got := waitKinds(t, &rec, "release"); !strings.HasPrefix(got, "wait attempt acquire:acquired") {
		t.Fatalf("RunOnce: %q", got)
	}
}

// orderRecorder records the kinds of a call's Events and signals the
// first EventLost.
type orderRecorder struct {
	mu    sync.Mutex
	kinds []dlock.EventKind
	lost  chan struct{}
	once  sync.Once
}

func (r *orderRecorder) Observe(e dlock.Event) {
	r.mu.Lock()
	r.kinds = append(r.kinds, e.Kind)
	r.mu.Unlock()
	if e.Kind == dlock.EventLost {
		r.once.Do(func() { close(r.lost) })
	}
}

func (r *orderRecorder) got() []dlock.EventKind {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]dlock.EventKind(nil), r.kinds...)
}

// checkCallOrder checks the promise: wait, attempts, acquire, then
// renews and at most one of lost and release, each once.
func checkCallOrder(t *testing.T, ks []dlock.EventKind) {
	t.Helper()
	i := 0
	if len(ks) == 0 || ks[0] != dlock.EventWait {
		t.Fatalf("events %v: not starting with wait", ks)
	}
	for i = 1; i < len(ks) && ks[i] == dlock.EventAttempt; i++ {
	}
	if i == len(ks) || ks[i] != dlock.EventAcquire {
		t.Fatalf("events %v: no acquire after the attempts", ks)
	}
	for i++; i < len(ks) && ks[i] == dlock.EventRenew; i++ {
	}
	if i < len(ks) && (ks[i] == dlock.EventLost || ks[i] == dlock.EventRelease) {
		i++
	}
	if i != len(ks) {
		t.Fatalf("events %v: out of order from index %d", ks, i)
	}
}

// A Lock lost (on the watchdog's goroutine) while the caller is still
// reporting its EventAcquire reaches the call's Observer as lost after
// acquire: the Lock's Events come after its EventAcquire.
// Symptom: the loss came first, and dlockprom's locks_held counted the lock held for ever.
func TestCallObserver_LossDuringAcquireIsReportedAfterIt(t *testing.T) {
	ml := memlock.New()
	rec := &orderRecorder{lost: make(chan struct{})}
	var blocked atomic.Bool
	// The first call observer stalls the caller inside EventAcquire until
	// the Lock has been lost (or 2s, generous: the loss is reported only
	// after the acquire, so the wait always times out).
	stall := dlock.ObserverFunc(func(e dlock.Event) {
		if e.Kind != dlock.EventAcquire || e.Result != dlock.ResultAcquired || !blocked.CompareAndSwap(false, true) {
			return
		}
		ml.Expire(e.Key)
		select {
		case <-rec.lost:
		case <-time.After(2 * time.Second):
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lk, err := ml.Acquire(ctx, "k", dlock.WithTTL(dlock.MinTTL), dlock.WithCallObserver(stall), dlock.WithCallObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-lk.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("the expired lock was not lost")
	}
	select {
	case <-rec.lost:
	case <-time.After(10 * time.Second):
		t.Fatalf("no EventLost; events %v", rec.got())
	}
	if err := lk.Release(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Release of a lost lock: %v", err)
	}
	checkCallOrder(t, rec.got())
}

// One call observer shared by many concurrent calls on one key, with
// Release racing the loss (Expire) of each Lock: every call's Events stay
// whole and in order. Per call, the shared observer's
// Events are told apart by owner.
func TestCallObserver_SharedByRacingCallsKeepsEachCallsOrder(t *testing.T) {
	ml := memlock.New()
	var mu sync.Mutex
	byOwner := map[string][]dlock.EventKind{}
	perCall := func() (*orderRecorder, dlock.Option) {
		r := &orderRecorder{lost: make(chan struct{})}
		return r, dlock.WithCallObserver(r)
	}
	shared := dlock.ObserverFunc(func(e dlock.Event) {
		if e.Owner == "" {
			return
		}
		mu.Lock()
		byOwner[e.Owner] = append(byOwner[e.Owner], e.Kind)
		mu.Unlock()
	})
	sharedOpt := dlock.WithCallObserver(shared)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 8
	recs := make([]*orderRecorder, n)
	var wg sync.WaitGroup
	for i := range n {
		r, opt := perCall()
		recs[i] = r
		wg.Go(func() {
			lk, err := ml.Acquire(ctx, "shared", dlock.WithTTL(dlock.MinTTL), sharedOpt, opt)
			if err != nil {
				t.Error(err)
				return
			}
			var inner sync.WaitGroup
			inner.Go(func() { ml.Expire("shared") })
			inner.Go(func() { _ = lk.Release(ctx) })
			inner.Wait()
		})
	}
	wg.Wait()
	for _, r := range recs {
		// A loss is reported a moment after Lost() closes: wait for the
		// last Event (bounded).
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
			ks := r.got()
			if k := ks[len(ks)-1]; k == dlock.EventLost || k == dlock.EventRelease {
				break
			}
		}
		checkCallOrder(t, r.got())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(byOwner) != n {
		t.Fatalf("%d owners seen by the shared observer, want %d", len(byOwner), n)
	}
	for o, ks := range byOwner {
		ends := 0
		for _, k := range ks {
			if k == dlock.EventLost || k == dlock.EventRelease {
				ends++
			}
		}
		if ks[0] != dlock.EventAcquire || ends != 1 {
			t.Fatalf("owner %s: events %v, want acquire first and one end", o, ks)
		}
	}
}

// A call observer that panics on every Event kind, or calls back into
// the Lock (Release from its own EventRenew), breaks nothing.
func TestCallObserver_PanicOrReentryBreaksNothing(t *testing.T) {
	ml := memlock.New()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for k := dlock.EventWait; k <= dlock.EventRelease; k++ {
		o := dlock.ObserverFunc(func(e dlock.Event) {
			if e.Kind == k {
				panic("observer bug on " + k.String())
			}
		})
		lk, err := ml.Acquire(ctx, "p", dlock.WithCallObserver(o))
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		if err := lk.Refresh(ctx); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		lk, err = ml.Acquire(ctx, "p", dlock.WithCallObserver(o))
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		ml.Expire("p")
		if err := lk.Refresh(ctx); !errors.Is(err, dlock.ErrLockLost) {
			t.Fatalf("%s: %v", k, err)
		}
	}
	var lkp atomic.Pointer[dlock.Lock]
	done := make(chan error, 1)
	reenter := dlock.ObserverFunc(func(e dlock.Event) {
		if e.Kind == dlock.EventRenew {
			if l := lkp.Load(); l != nil && lkp.CompareAndSwap(l, nil) {
				done <- l.Release(ctx)
			}
		}
	})
	lk, err := ml.Acquire(ctx, "r", dlock.WithCallObserver(reenter))
	if err != nil {
		t.Fatal(err)
	}
	lkp.Store(lk)
	if err := lk.Refresh(ctx); err != nil && !errors.Is(err, dlock.ErrReleased) {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Release from the observer hung")
	}
}

// hungRenewDriver grants every attempt; its leases' renewals never answer
// (until their context ends), so its locks are lost at their deadlines.
type hungRenewDriver struct {
	mu  sync.Mutex
	tok uint64
}

func (d *hungRenewDriver) Spec() driver.Spec { return driver.Spec{Name: "hung-renew"} }

func (d *hungRenewDriver) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.tok++
	return driver.Grant{Lease: hungRenewLease{}, Token: d.tok}, nil
}

type hungRenewLease struct{}

func (hungRenewLease) Refresh(ctx context.Context, ttl time.Duration) error {
	<-ctx.Done()
	return ctx.Err()
}

func (hungRenewLease) Release(ctx context.Context) error { return nil }

// An Observer blocked on one lock's EventLost does not keep another
// lock's Lost() open past its deadline: the watchdog reports losses after
// its losing loop.
// Symptom: a blocked Observer kept every other Lost() open for ever, past the server's expiry.
func TestObserver_BlockedOnLossDelaysNoOtherLoss(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	var once sync.Once
	e := dlock.NewEngine(&hungRenewDriver{}, dlock.WithObserver(dlock.ObserverFunc(func(ev dlock.Event) {
		if ev.Kind == dlock.EventLost {
			once.Do(func() { <-block }) // the first loss blocks the Observer
		}
	})))
	ctx := context.Background()
	a, err := e.TryAcquire(ctx, "a", dlock.WithTTL(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	b, err := e.TryAcquire(ctx, "b", dlock.WithTTL(400*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	<-a.Lost()
	select {
	case <-b.Lost():
		if late := time.Since(b.Deadline()); late > 50*time.Millisecond {
			t.Errorf("b's Lost() closed %v after its deadline", late)
		}
	case <-time.After(time.Until(b.Deadline()) + 300*time.Millisecond):
		t.Fatal("b's Lost() still open 300ms after its deadline: an Observer blocked on a's EventLost stalls the watchdog")
	}
}

// A typed-nil Observer (ObserverFunc(nil), a nil *T) counts as no
// Observer.
// Symptom: it panicked with a nil dereference on the first Event.
func TestObserver_TypedNilCountsAsNone(t *testing.T) {
	ctx := context.Background()
	l := memlock.New(dlock.WithObserver(dlock.ObserverFunc(nil)))
	lk, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("TryAcquire with ObserverFunc(nil): %v", err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if o := observe.Of(nil); o != nil {
		t.Errorf("observe.Of(nil) = %v, want nil", o)
	}
	if o := observe.Of([]driver.Option{dlock.WithObserver(dlock.ObserverFunc(nil))}); o != nil {
		t.Errorf("observe.Of(typed nil) = %v, want nil", o)
	}
}

// An Observer that panics on every Event loses only its own Events:
// TryAcquire returns the *Lock, its Release frees the key, and the
// Observer is still called for the later Events.
// Symptom: a panic on EventAcquire unwound TryAcquire after the grant, leaving the key held for ever.
func TestObserver_PanicDropsOnlyItsEvent(t *testing.T) {
	ctx := context.Background()
	var (
		mu   sync.Mutex // the watchdog's renewal may report from its own goroutine
		seen []dlock.EventKind
	)
	l := memlock.New(dlock.WithObserver(dlock.ObserverFunc(func(e dlock.Event) {
		mu.Lock()
		seen = append(seen, e.Kind)
		mu.Unlock()
		panic("observer bug")
	})))
	var (
		lk  *dlock.Lock
		err error
	)
	if p := safely(func() { lk, err = l.TryAcquire(ctx, "k", dlock.WithTTL(200*time.Millisecond)) }); p != nil {
		t.Fatalf("TryAcquire panicked with the Observer's panic: %v", p)
	}
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if p := safely(func() { err = lk.Release(ctx) }); p != nil || err != nil {
		t.Fatalf("Release: panic %v, err %v", p, err)
	}
	if infos, _ := l.List(ctx, ""); len(infos) != 0 {
		t.Fatalf("key still held after Release: %+v", infos)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) < 4 { // wait, attempt, acquire, release
		t.Errorf("Observer saw %v: a panic must drop only its own Event", seen)
	}
}

// A guard's Observer that panics on EventRejected leaves the resource
// usable: the stale Put fails with ErrStaleToken and later calls return.
// Symptom: the panic unwound guard.Memory with the resource's mutex held, and every later call hung.
func TestObserver_PanicInGuardLeavesResourceUsable(t *testing.T) {
	ctx := context.Background()
	m := guard.NewMemory(dlock.WithObserver(dlock.ObserverFunc(func(dlock.Event) { panic("observer bug") })))
	if err := m.Put(ctx, "r", dlock.Fence{Token: 5, Owner: "a"}, "n", "v"); err != nil {
		t.Fatal(err)
	}
	var err error
	if p := safely(func() { err = m.Put(ctx, "r", dlock.Fence{Token: 4, Owner: "b"}, "n", "w") }); p != nil {
		t.Fatalf("Put panicked with the Observer's panic: %v", p)
	}
	if !errors.Is(err, dlock.ErrStaleToken) {
		t.Fatalf("stale Put: %v, want ErrStaleToken", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := m.Highest(cctx, "r"); err != nil {
			t.Error(err)
		}
		if _, _, err := m.Get(cctx, "r", dlock.Fence{Token: 6, Owner: "c"}, "n"); err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the resource is wedged after an Observer panic")
	}
}

func safely(f func()) (p any) {
	defer func() { p = recover() }()
	f()
	return nil
}
