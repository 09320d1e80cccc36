package dlock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/memlock"
)

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
