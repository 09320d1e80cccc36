package dlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/memlock"
)

func TestMain(m *testing.M) { testserver.Main(m) }

func TestConfigDefaults(t *testing.T) {
	c, err := dlock.NewConfig("k", 0)
	if err != nil {
		t.Fatal(err)
	}
	if c.TTL != dlock.DefaultTTL || c.DriftFactor != dlock.DefaultDriftFactor || c.DriftMin != dlock.DefaultDriftMin || c.Backoff == nil {
		t.Fatalf("defaults: %+v", c)
	}
	if c.Metadata[dlock.MetaHost] == "" || c.Metadata[dlock.MetaPID] == "" {
		t.Fatalf("default metadata missing: %v", c.Metadata)
	}
	if want := 30*time.Second/100 + dlock.DefaultDriftMin; c.Drift() != want {
		t.Fatalf("drift = %v, want %v", c.Drift(), want)
	}
	c, _ = dlock.NewConfig("k", 0, dlock.WithoutDefaultMetadata(), dlock.WithMetadata("a", "b"))
	if len(c.Metadata) != 1 || c.Metadata["a"] != "b" {
		t.Fatalf("metadata = %v", c.Metadata)
	}
	if _, err := dlock.NewConfig("k", 500*time.Millisecond, dlock.WithTTL(400*time.Millisecond)); !errors.Is(err, dlock.ErrInvalidTTL) {
		t.Fatalf("below backend minimum: %v", err)
	}
	if _, err := dlock.NewConfig("k", 0, dlock.WithDrift(0.6, 0)); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Fatalf("drift factor: %v", err)
	}
	if _, err := dlock.NewConfig("k", 0, nil); err != nil {
		t.Fatalf("nil option: %v", err)
	}
}

func TestValidateKey(t *testing.T) {
	for _, k := range []string{"", strings.Repeat("x", dlock.MaxKeyLen+1), "a\x00b", "\xff"} {
		if err := dlock.ValidateKey(k); !errors.Is(err, dlock.ErrInvalidKey) {
			t.Errorf("ValidateKey(%q) = %v", k, err)
		}
	}
	for _, k := range []string{"a", strings.Repeat("x", dlock.MaxKeyLen), "inventory:{42}/ü"} {
		if err := dlock.ValidateKey(k); err != nil {
			t.Errorf("ValidateKey(%q) = %v", k, err)
		}
	}
}

func TestBackoffBounds(t *testing.T) {
	b := dlock.ExpBackoff{Min: 4 * time.Millisecond, Max: 64 * time.Millisecond}
	for attempt := 1; attempt < 40; attempt++ {
		for i := 0; i < 50; i++ {
			d := b.Next(attempt)
			want := 4 * time.Millisecond << min(attempt-1, 4)
			if d < want/2 || d > want {
				t.Fatalf("attempt %d: %v not in [%v, %v]", attempt, d, want/2, want)
			}
		}
	}
	c := dlock.ConstBackoff{Delay: 10 * time.Millisecond, Jitter: 2 * time.Millisecond}
	for i := 0; i < 100; i++ {
		if d := c.Next(i); d < 8*time.Millisecond || d > 12*time.Millisecond {
			t.Fatalf("const backoff %v", d)
		}
	}
}

func TestErrorsUnwrap(t *testing.T) {
	na := &dlock.NotAcquiredError{Key: "k", Holders: []dlock.Holder{{Owner: "0123456789abcdef", Metadata: map[string]string{"host": "h", "pid": "1"}, TTL: time.Second}}, Cause: context.Canceled}
	if !errors.Is(na, dlock.ErrNotAcquired) || !errors.Is(na, context.Canceled) {
		t.Fatal("NotAcquiredError does not unwrap")
	}
	if s := na.Error(); !strings.Contains(s, "host=h pid=1") || !strings.Contains(s, "0123456789ab") || !strings.HasPrefix(s, "dlock: ") {
		t.Fatalf("message %q", s)
	}
	le := &dlock.LostError{Key: "k", Token: 3, Reason: "x", Cause: dlock.ErrNotHeld}
	if !errors.Is(le, dlock.ErrLockLost) || !errors.Is(le, dlock.ErrNotHeld) {
		t.Fatal("LostError does not unwrap")
	}
	st := &dlock.StaleTokenError{Resource: "r", Token: 1, Highest: 2}
	if !errors.Is(st, dlock.ErrStaleToken) {
		t.Fatal("StaleTokenError does not unwrap")
	}
}

func TestLockContext(t *testing.T) {
	l := memlock.New()
	ctx := context.Background()
	lk, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	lctx, cancel := lk.Context(ctx)
	defer cancel()
	l.Expire("k")
	if err := lk.Refresh(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Refresh after expiry = %v", err)
	}
	select {
	case <-lctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("lock context not cancelled on loss")
	}
	if !errors.Is(context.Cause(lctx), dlock.ErrLockLost) {
		t.Fatalf("cause = %v", context.Cause(lctx))
	}
}

func TestNilArguments(t *testing.T) {
	if err := dlock.Do(context.Background(), nil, "k", func(context.Context, *dlock.Lock) error { return nil }); !errors.Is(err, dlock.ErrNilClient) {
		t.Fatalf("Do(nil locker) = %v", err)
	}
	//lint:ignore SA1012 checking that a nil context is an error, not a panic
	if _, err := memlock.New().Acquire(nil, "k"); err == nil { //nolint:staticcheck
		t.Fatal("nil context accepted")
	}
}

func TestWatchdogStopsWhenIdle(t *testing.T) {
	l := dlock.NewEngine(newSlowClient(newStore()))
	ctx := context.Background()
	lk, err := l.Acquire(ctx, "k", dlock.WithTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if dlock.Renewing(l) != 1 {
		t.Fatalf("renewing %d", dlock.Renewing(l))
	}
	time.Sleep(400 * time.Millisecond)
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if dlock.Renewing(l) != 0 {
		t.Fatalf("renewing %d after release", dlock.Renewing(l))
	}
	// goleak in TestMain checks the watchdog goroutine has exited.
}
