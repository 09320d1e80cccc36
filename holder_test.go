package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/filelock"
	"github.com/dlock-go/dlock/memlock"
)

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

// listingLocker is a Locker that lists.
type listingLocker interface {
	dlock.Locker
	dlock.Lister
}

// listingBackends are the root tree's listing backends: memlock (the
// service's own clock) and filelock (FillHeldFor from MetaAcquired).
func listingBackends(t *testing.T) map[string]listingLocker {
	t.Helper()
	fl, err := filelock.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ml := memlock.New()
	return map[string]listingLocker{"memlock": ml, "filelock": fl}
}

func onlyHolder(t *testing.T, l dlock.Lister, key string) dlock.Holder {
	t.Helper()
	infos, err := l.List(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range infos {
		if in.Key == key && len(in.Holders) == 1 {
			return in.Holders[0]
		}
	}
	t.Fatalf("List(%q) = %+v: want one holder of %q", key, infos, key)
	return dlock.Holder{}
}

// HeldFor is never negative and never more than the time since the call
// that won was made (plus the millisecond granularity of MetaAcquired).
func TestHeldFor_WithinTimeSinceWinningAttempt(t *testing.T) {
	ctx := context.Background()
	for name, l := range listingBackends(t) {
		t.Run(name, func(t *testing.T) {
			before := time.Now()
			lk, err := l.TryAcquire(ctx, "heldfor/bounds")
			if err != nil {
				t.Fatal(err)
			}
			defer lk.Release(ctx)
			h := onlyHolder(t, l, "heldfor/bounds")
			if most := time.Since(before) + time.Millisecond; h.HeldFor < 0 || h.HeldFor > most {
				t.Errorf("HeldFor = %v, want it in [0, %v]", h.HeldFor, most)
			}
		})
	}
}

// A blocking Acquire that waited for the holder does not count its wait
// as held.
func TestHeldFor_ExcludesTheWait(t *testing.T) {
	ctx := context.Background()
	const hold = time.Second
	for name, l := range listingBackends(t) {
		t.Run(name, func(t *testing.T) {
			called := time.Now()
			_, lk, _ := acquireAfterHolder(t, l, "heldfor/wait", hold)
			if lk == nil {
				return
			}
			defer lk.Release(ctx)
			h := onlyHolder(t, l, "heldfor/wait")
			// The waiter waited at least hold; what it held is at most
			// the time since the release (generously: half of hold).
			if waited := time.Since(called); h.HeldFor < 0 || h.HeldFor > waited-hold/2 {
				t.Errorf("HeldFor = %v after a wait of %v: the wait is counted", h.HeldFor, hold)
			}
		})
	}
}

// User metadata named "acquired" (junk, in the future, far in the past,
// huge) and WithoutDefaultMetadata never panic nor give a negative
// HeldFor; a value that is not Unix ms is ignored.
func TestHeldFor_NeverNegativeWithUserAcquired(t *testing.T) {
	ctx := context.Background()
	vals := []string{"", "yesterday", "-1", "0", "+5", " 1", "1e3", "0x10",
		strconv.FormatInt(math.MaxInt64, 10), "99999999999999999999999",
		strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10),
		strconv.FormatInt(time.Now().Add(-time.Hour).UnixMilli(), 10)}
	for name, l := range listingBackends(t) {
		t.Run(name, func(t *testing.T) {
			for i, v := range vals {
				for _, noDefault := range []bool{false, true} {
					key := fmt.Sprintf("heldfor/user/%d/%v", i, noDefault)
					opts := []dlock.Option{dlock.WithMetadata(dlock.MetaAcquired, v)}
					if noDefault {
						opts = append(opts, dlock.WithoutDefaultMetadata())
					}
					lk, err := l.TryAcquire(ctx, key, opts...)
					if err != nil {
						t.Fatalf("acquired=%q: %v", v, err)
					}
					h := onlyHolder(t, l, key)
					if h.HeldFor < 0 {
						t.Errorf("acquired=%q (no default %v): HeldFor %v is negative", v, noDefault, h.HeldFor)
					}
					if err := lk.Release(ctx); err != nil {
						t.Fatal(err)
					}
				}
			}
			// WithoutDefaultMetadata alone: no "acquired" stored.
			lk, err := l.TryAcquire(ctx, "heldfor/nodefault", dlock.WithoutDefaultMetadata())
			if err != nil {
				t.Fatal(err)
			}
			defer lk.Release(ctx)
			h := onlyHolder(t, l, "heldfor/nodefault")
			if _, ok := h.Metadata[dlock.MetaAcquired]; ok || h.HeldFor < 0 {
				t.Errorf("WithoutDefaultMetadata: metadata %v, HeldFor %v", h.Metadata, h.HeldFor)
			}
		})
	}
}

// The value of a user's own "acquired" metadata is stored as given
// whether the first attempt wins or a later one does.
// Symptom: the core stamped over it from the second attempt on.
func TestMetadata_UserAcquiredKeptAcrossAttempts(t *testing.T) {
	ctx := context.Background()
	const mine = "1234"
	for name, l := range listingBackends(t) {
		t.Run(name, func(t *testing.T) {
			first, err := l.TryAcquire(ctx, "heldfor/keep")
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan *dlock.Lock, 1)
			go func() {
				lk, err := l.Acquire(ctx, "heldfor/keep", dlock.WithWait(time.Minute), dlock.WithMetadata(dlock.MetaAcquired, mine))
				if err != nil {
					t.Error(err)
				}
				got <- lk
			}()
			time.Sleep(200 * time.Millisecond)
			if err := first.Release(ctx); err != nil {
				t.Fatal(err)
			}
			lk := <-got
			if lk == nil {
				return
			}
			defer lk.Release(ctx)
			if v := lk.Metadata()[dlock.MetaAcquired]; v != mine {
				t.Errorf("Lock.Metadata()[acquired] = %q after a wait, want the user's %q (a first-attempt win keeps it)", v, mine)
			}
			if v := onlyHolder(t, l, "heldfor/keep").Metadata[dlock.MetaAcquired]; v != mine {
				t.Errorf("stored acquired = %q after a wait, want the user's %q", v, mine)
			}
		})
	}
}

// Many goroutines acquire, list and release at once (run with -race);
// every HeldFor listed stays in bounds.
func TestHeldFor_InBoundsUnderConcurrentListing(t *testing.T) {
	ctx := context.Background()
	for name, l := range listingBackends(t) {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			var wg sync.WaitGroup
			for g := 0; g < 8; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 20; i++ {
						key := fmt.Sprintf("heldfor/race/%d", i%3)
						lk, err := l.Acquire(ctx, key, dlock.WithWait(30*time.Second), dlock.WithMetadata("g", strconv.Itoa(g)))
						if err != nil {
							t.Error(err)
							return
						}
						infos, err := l.List(ctx, "heldfor/race/")
						if err != nil {
							t.Error(err)
						}
						for _, in := range infos {
							for _, h := range in.Holders {
								if h.HeldFor < 0 || h.HeldFor > time.Since(start)+time.Millisecond {
									t.Errorf("%s: HeldFor %v out of [0, %v]", in.Key, h.HeldFor, time.Since(start))
								}
							}
						}
						_ = lk.Metadata()
						if err := lk.Release(ctx); err != nil {
							t.Error(err)
						}
					}
				}()
			}
			wg.Wait()
		})
	}
}

// listDriver is a driver whose only use is listing.
type listDriver struct {
	list func(ctx context.Context, prefix string) ([]dlock.Info, error)
}

func (listDriver) Spec() driver.Spec { return driver.Spec{Name: "listfake"} }
func (listDriver) Try(context.Context, *driver.Request) (driver.Grant, error) {
	return driver.Grant{}, errors.New("unused")
}
func (d listDriver) ListHeld(ctx context.Context, prefix string) ([]dlock.Info, error) {
	return d.list(ctx, prefix)
}

// The Engine's List sorts the driver's answer by key and fills HeldFor
// from MetaAcquired where the driver left it 0.
func TestEngineList_SortsAndFillsHeldFor(t *testing.T) {
	acquired := strconv.FormatInt(time.Now().Add(-time.Minute).UnixMilli(), 10)
	e := dlock.NewEngine(listDriver{list: func(context.Context, string) ([]dlock.Info, error) {
		return []dlock.Info{
			{Key: "b", Holders: []dlock.Holder{{HeldFor: time.Second}}},
			{Key: "a", Holders: []dlock.Holder{{Metadata: map[string]string{dlock.MetaAcquired: acquired}}}},
		}, nil
	}})
	infos, err := e.List(ctxT(t), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 || infos[0].Key != "a" || infos[1].Key != "b" {
		t.Fatalf("List = %+v, want a then b", infos)
	}
	if h := infos[0].Holders[0].HeldFor; h < time.Minute {
		t.Errorf("a's HeldFor = %v, want at least a minute from MetaAcquired", h)
	}
	if h := infos[1].Holders[0].HeldFor; h != time.Second {
		t.Errorf("b's HeldFor = %v, want the driver's 1s kept", h)
	}
}

// A List cut off by its context is ErrUnavailable joined with the
// context's error, whether the Engine abandons the driver or the driver's
// client returns the context's error first, and also when the context had
// ended before the call.
// Symptom: the error wrapped ErrUnavailable only when the Engine abandoned the driver first.
func TestEngineList_ContextEndIsUnavailable(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	e := dlock.NewEngine(listDriver{list: func(ctx context.Context, _ string) ([]dlock.Info, error) {
		cancel() // the client gives up as the context ends
		return nil, ctx.Err()
	}})
	if _, err := e.List(ctx, ""); !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Errorf("List whose client gave up at the context's end = %v, want ErrUnavailable and context.Canceled", err)
	}
	if _, err := e.List(ctx, ""); !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Errorf("List with an ended context = %v, want ErrUnavailable and context.Canceled", err)
	}
	if _, err := dlock.NewEngine(noBreak{}).List(ctxT(t), ""); !errors.Is(err, dlock.ErrUnsupported) {
		t.Errorf("List over a driver without ListHeld = %v, want ErrUnsupported", err)
	}
}
