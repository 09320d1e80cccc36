package dlock_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
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

func TestHoldCapLossReason(t *testing.T) {
	rec := &dlocktest.Recorder{}
	l := memlock.New(dlock.WithObserver(rec))
	lk, err := l.Acquire(ctxT(t), "k", dlock.WithTTL(200*time.Millisecond), dlock.WithMaxHold(250*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	<-lk.Lost()
	var le *dlock.LostError
	if !errors.As(lk.Err(), &le) || le.Reason != dlock.LossHoldCap || !errors.Is(lk.Err(), dlock.ErrHoldCapReached) {
		t.Fatalf("Err() = %v, want reason hold_cap", lk.Err())
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

func TestUnsupportedModeNamesIt(t *testing.T) {
	e := dlock.NewEngine(newSlowClient(newStore()))
	for _, o := range []struct {
		opt  dlock.Option
		name string
	}{{dlock.WithShared(), "shared"}, {dlock.WithLimit(3), "limited"}} {
		_, err := e.TryAcquire(ctxT(t), "k", o.opt)
		if !errors.Is(err, dlock.ErrUnsupported) || !strings.Contains(err.Error(), o.name) {
			t.Errorf("%s on a driver without it: %v", o.name, err)
		}
	}
}

func TestFailedEngine(t *testing.T) {
	e := dlock.FailedEngine(dlock.ErrNilClient)
	if _, err := e.Acquire(ctxT(t), "k"); !errors.Is(err, dlock.ErrNilClient) {
		t.Fatal(err)
	}
	if _, err := dlock.NewEngine(nil).TryAcquire(ctxT(t), "k"); !errors.Is(err, dlock.ErrNilClient) {
		t.Fatal(err)
	}
	var nilEngine *dlock.Engine
	if err := nilEngine.Check(ctxT(t)); !errors.Is(err, dlock.ErrNilClient) {
		t.Fatal(err)
	}
}

// The hold cap's LostError says so once ("hold cap reached: dlock: hold
// cap reached" before), and still wraps ErrHoldCapReached.
func TestLostErrorHoldCapText(t *testing.T) {
	e := &dlock.LostError{Key: "k", Token: 7, Reason: dlock.LossHoldCap, Cause: dlock.ErrHoldCapReached}
	if got, want := e.Error(), `dlock: lock "k" (token 7) lost: hold cap reached`; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(e, dlock.ErrHoldCapReached) || !errors.Is(e, dlock.ErrLockLost) {
		t.Errorf("%v does not wrap ErrHoldCapReached and ErrLockLost", e)
	}
}
