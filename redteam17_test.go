package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/filelock"
	"github.com/dlock-go/dlock/memlock"
)

// Red team 17: HELD-FOR (MetaAcquired, FillHeldFor).

// rt17Lister is a Locker that lists.
type rt17Lister interface {
	dlock.Locker
	dlock.Lister
}

// rt17Backends are the root tree's listing backends: memlock (the
// service's own clock) and filelock (FillHeldFor from MetaAcquired).
func rt17Backends(t *testing.T) map[string]rt17Lister {
	t.Helper()
	fl, err := filelock.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ml := memlock.New()
	return map[string]rt17Lister{"memlock": ml, "filelock": fl}
}

func rt17Holder(t *testing.T, l dlock.Lister, key string) dlock.Holder {
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

// TestRedTeam17_HeldForBounds: HeldFor is never negative and never more
// than the time since the call that won was made (plus the millisecond
// granularity of MetaAcquired).
func TestRedTeam17_HeldForBounds(t *testing.T) {
	ctx := context.Background()
	for name, l := range rt17Backends(t) {
		t.Run(name, func(t *testing.T) {
			before := time.Now()
			lk, err := l.TryAcquire(ctx, "rt17/bounds")
			if err != nil {
				t.Fatal(err)
			}
			defer lk.Release(ctx)
			h := rt17Holder(t, l, "rt17/bounds")
			if most := time.Since(before) + time.Millisecond; h.HeldFor < 0 || h.HeldFor > most {
				t.Errorf("HeldFor = %v, want it in [0, %v]", h.HeldFor, most)
			}
		})
	}
}

// TestRedTeam17_HeldForNotTheWait: a blocking Acquire that waited for the
// holder does not count its wait as held.
func TestRedTeam17_HeldForNotTheWait(t *testing.T) {
	ctx := context.Background()
	const hold = time.Second
	for name, l := range rt17Backends(t) {
		t.Run(name, func(t *testing.T) {
			called := time.Now()
			_, lk, _ := acquireAfterHolder(t, l, "rt17/wait", hold)
			if lk == nil {
				return
			}
			defer lk.Release(ctx)
			h := rt17Holder(t, l, "rt17/wait")
			// The waiter waited at least hold; what it held is at most
			// the time since the release (generously: half of hold).
			if waited := time.Since(called); h.HeldFor < 0 || h.HeldFor > waited-hold/2 {
				t.Errorf("HeldFor = %v after a wait of %v: the wait is counted", h.HeldFor, hold)
			}
		})
	}
}

// TestRedTeam17_HeldForUserAcquired: user metadata named "acquired" (junk,
// in the future, far in the past, huge) and WithoutDefaultMetadata never
// panic nor give a negative HeldFor; a value that is not Unix ms is ignored.
func TestRedTeam17_HeldForUserAcquired(t *testing.T) {
	ctx := context.Background()
	vals := []string{"", "yesterday", "-1", "0", "+5", " 1", "1e3", "0x10",
		strconv.FormatInt(math.MaxInt64, 10), "99999999999999999999999",
		strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10),
		strconv.FormatInt(time.Now().Add(-time.Hour).UnixMilli(), 10)}
	for name, l := range rt17Backends(t) {
		t.Run(name, func(t *testing.T) {
			for i, v := range vals {
				for _, noDefault := range []bool{false, true} {
					key := fmt.Sprintf("rt17/user/%d/%v", i, noDefault)
					opts := []dlock.Option{dlock.WithMetadata(dlock.MetaAcquired, v)}
					if noDefault {
						opts = append(opts, dlock.WithoutDefaultMetadata())
					}
					lk, err := l.TryAcquire(ctx, key, opts...)
					if err != nil {
						t.Fatalf("acquired=%q: %v", v, err)
					}
					h := rt17Holder(t, l, key)
					if h.HeldFor < 0 {
						t.Errorf("acquired=%q (no default %v): HeldFor %v is negative", v, noDefault, h.HeldFor)
					}
					if err := lk.Release(ctx); err != nil {
						t.Fatal(err)
					}
				}
			}
			// WithoutDefaultMetadata alone: no "acquired" stored.
			lk, err := l.TryAcquire(ctx, "rt17/nodefault", dlock.WithoutDefaultMetadata())
			if err != nil {
				t.Fatal(err)
			}
			defer lk.Release(ctx)
			h := rt17Holder(t, l, "rt17/nodefault")
			if _, ok := h.Metadata[dlock.MetaAcquired]; ok || h.HeldFor < 0 {
				t.Errorf("WithoutDefaultMetadata: metadata %v, HeldFor %v", h.Metadata, h.HeldFor)
			}
		})
	}
}

// TestRedTeam17_UserAcquiredKeptAcrossAttempts: the value of a user's own
// "acquired" metadata is stored as given whether the first attempt wins
// or a later one does (the core must not stamp over it on attempt 2 only).
func TestRedTeam17_UserAcquiredKeptAcrossAttempts(t *testing.T) {
	ctx := context.Background()
	const mine = "1234"
	for name, l := range rt17Backends(t) {
		t.Run(name, func(t *testing.T) {
			first, err := l.TryAcquire(ctx, "rt17/keep")
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan *dlock.Lock, 1)
			go func() {
				lk, err := l.Acquire(ctx, "rt17/keep", dlock.WithWait(time.Minute), dlock.WithMetadata(dlock.MetaAcquired, mine))
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
			if v := rt17Holder(t, l, "rt17/keep").Metadata[dlock.MetaAcquired]; v != mine {
				t.Errorf("stored acquired = %q after a wait, want the user's %q", v, mine)
			}
		})
	}
}

// TestRedTeam17_MetadataLimit: metadata right at MaxMetadataLen. Without
// default metadata the user has the whole budget; with it, the defaults
// (host, pid, and now acquired: 8+13 bytes) count, and a call over the
// budget fails with ErrInvalidOption naming the size and the limit.
func TestRedTeam17_MetadataLimit(t *testing.T) {
	ctx := context.Background()
	l := memlock.New()
	const k = "note"
	full := strings.Repeat("v", dlock.MaxMetadataLen-len(k))
	lk, err := l.TryAcquire(ctx, "rt17/limit", dlock.WithoutDefaultMetadata(), dlock.WithMetadata(k, full))
	if err != nil {
		t.Fatalf("metadata of exactly %d bytes without defaults: %v", dlock.MaxMetadataLen, err)
	}
	lk.Release(ctx)
	_, err = l.TryAcquire(ctx, "rt17/limit", dlock.WithoutDefaultMetadata(), dlock.WithMetadata(k, full+"v"))
	if !errors.Is(err, dlock.ErrInvalidOption) || !strings.Contains(err.Error(), strconv.Itoa(dlock.MaxMetadataLen)) {
		t.Errorf("one byte over: %v, want ErrInvalidOption naming %d", err, dlock.MaxMetadataLen)
	}
	// With the defaults: what fitted beside host and pid alone is now 21
	// bytes too much (the acquired stamp); the error is ErrInvalidOption.
	host, _ := os.Hostname()
	oldBudget := dlock.MaxMetadataLen - len(dlock.MetaHost) - len(host) - len(dlock.MetaPID) - len(strconv.Itoa(os.Getpid())) - len(k)
	_, err = l.TryAcquire(ctx, "rt17/limit", dlock.WithMetadata(k, strings.Repeat("v", oldBudget)))
	if err != nil && (!errors.Is(err, dlock.ErrInvalidOption) || !strings.Contains(err.Error(), "acquired included")) {
		t.Errorf("at the old budget: %v, want nil or ErrInvalidOption saying the defaults count", err)
	}
	t.Logf("user metadata that fitted beside host and pid (%d bytes): %v", oldBudget+len(k), err)
	newBudget := oldBudget - len(dlock.MetaAcquired) - len(strconv.FormatInt(time.Now().UnixMilli(), 10))
	lk, err = l.TryAcquire(ctx, "rt17/limit", dlock.WithMetadata(k, strings.Repeat("v", newBudget)))
	if err != nil {
		t.Fatalf("at the budget left beside host, pid and acquired: %v", err)
	}
	lk.Release(ctx)
}

// TestRedTeam17_HeldForRace: many goroutines acquire, list and release
// at once (run with -race); every HeldFor listed stays in bounds.
func TestRedTeam17_HeldForRace(t *testing.T) {
	ctx := context.Background()
	for name, l := range rt17Backends(t) {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			var wg sync.WaitGroup
			for g := 0; g < 8; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 20; i++ {
						key := fmt.Sprintf("rt17/race/%d", i%3)
						lk, err := l.Acquire(ctx, key, dlock.WithWait(30*time.Second), dlock.WithMetadata("g", strconv.Itoa(g)))
						if err != nil {
							t.Error(err)
							return
						}
						infos, err := l.List(ctx, "rt17/race/")
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
