package dlock_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

func TestFillHeldFor(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	at := func(d time.Duration) map[string]string {
		return map[string]string{dlock.MetaAcquired: strconv.FormatInt(now.Add(-d).UnixMilli(), 10)}
	}
	infos := []dlock.Info{{Key: "k", Holders: []dlock.Holder{
		{Metadata: at(1500 * time.Millisecond)},                        // derived
		{Metadata: at(time.Hour), HeldFor: 3 * time.Second},            // the service's own kept
		{Metadata: at(-time.Minute)},                                   // holder's clock ahead: 0, never negative
		{Metadata: map[string]string{dlock.MetaAcquired: "yesterday"}}, // junk: unknown
		{Metadata: map[string]string{dlock.MetaAcquired: "-5"}},        // junk: unknown
		{}, // WithoutDefaultMetadata: unknown
	}}}
	dlock.FillHeldFor(infos, now)
	want := []time.Duration{1500 * time.Millisecond, 3 * time.Second, 0, 0, 0, 0}
	for i, h := range infos[0].Holders {
		if h.HeldFor != want[i] {
			t.Errorf("holder %d: HeldFor %v, want %v", i, h.HeldFor, want[i])
		}
	}
	dlock.FillHeldFor(nil, now) // no panic
}

// MetaAcquired is the winning attempt's time, not the call's: a waiter
// that waited does not count its wait as held.
func TestAcquiredIsTheWinningAttempts(t *testing.T) {
	l := memlock.New()
	ctx := context.Background()
	first, lk, released := acquireAfterHolder(t, l, "k", 100*time.Millisecond)
	if lk == nil {
		return
	}
	defer lk.Release(ctx)
	ms, err := strconv.ParseInt(lk.Metadata()[dlock.MetaAcquired], 10, 64)
	if err != nil || time.UnixMilli(ms).Before(released) {
		t.Fatalf("waiter's %s = %q, want a time at or after the release (%d)", dlock.MetaAcquired, lk.Metadata()[dlock.MetaAcquired], released.UnixMilli())
	}
	if _, ok := first.Metadata()[dlock.MetaAcquired]; !ok {
		t.Fatalf("first holder's metadata %v has no %s", first.Metadata(), dlock.MetaAcquired)
	}
	if md := mustNoDefault(t, l); len(md) != 0 {
		t.Fatalf("WithoutDefaultMetadata: metadata %v, want none", md)
	}
}

// acquireAfterHolder has l's first lock hold key for about hold while a
// blocking Acquire waits for it, then releases it: it returns both locks
// (the second nil if its Acquire failed, already reported) and the time of
// the release, truncated to MetaAcquired's millisecond.
func acquireAfterHolder(t *testing.T, l dlock.Locker, key string, hold time.Duration) (first, waiter *dlock.Lock, released time.Time) {
	t.Helper()
	ctx := context.Background()
	first, err := l.TryAcquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *dlock.Lock, 1)
	go func() {
		lk, err := l.Acquire(ctx, key, dlock.WithWait(time.Minute))
		if err != nil {
			t.Error(err)
		}
		got <- lk
	}()
	time.Sleep(hold)
	released = time.Now().Truncate(time.Millisecond)
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	return first, <-got, released
}

func mustNoDefault(t *testing.T, l dlock.Locker) map[string]string {
	t.Helper()
	lk, err := l.TryAcquire(context.Background(), "nodefault", dlock.WithoutDefaultMetadata())
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	return lk.Metadata()
}
