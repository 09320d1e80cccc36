package dlock_test

import (
	"context"
	"errors"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

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

// TTLs and drifts out of range are refused; huge waits and hold caps mean
// for ever.
// Symptom: huge TTLs overflowed backends, and WithDrift(NaN) was accepted and lost every lock at once.
func TestConfigLimits(t *testing.T) {
	ok := []dlock.Option{dlock.WithTTL(dlock.MaxTTL), dlock.WithTTL(dlock.MinTTL)}
	for _, o := range ok {
		if _, err := dlock.NewConfig("k", 0, o); err != nil {
			t.Errorf("valid option: %v", err)
		}
	}
	bad := map[string]struct {
		opt  dlock.Option
		want error
	}{
		"ttl above max":    {dlock.WithTTL(dlock.MaxTTL + time.Millisecond), dlock.ErrInvalidTTL},
		"ttl max int64":    {dlock.WithTTL(math.MaxInt64), dlock.ErrInvalidTTL},
		"ttl min int64":    {dlock.WithTTL(math.MinInt64), dlock.ErrInvalidTTL},
		"drift NaN":        {dlock.WithDrift(math.NaN(), 0), dlock.ErrInvalidOption},
		"drift +Inf":       {dlock.WithDrift(math.Inf(1), 0), dlock.ErrInvalidOption},
		"drift -Inf":       {dlock.WithDrift(math.Inf(-1), 0), dlock.ErrInvalidOption},
		"drift factor 0.5": {dlock.WithDrift(0.5, 0), dlock.ErrInvalidOption},
		"drift min ≥ ttl":  {dlock.WithDrift(0, math.MaxInt64), dlock.ErrInvalidOption},
		"drift min < 0":    {dlock.WithDrift(0, -1), dlock.ErrInvalidOption},
		"max hold < 0":     {dlock.WithMaxHold(math.MinInt64), dlock.ErrInvalidOption},
		"wait < 0":         {dlock.WithWait(-time.Nanosecond), dlock.ErrInvalidOption},
	}
	for name, c := range bad {
		if _, err := dlock.NewConfig("k", 0, c.opt); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", name, err, c.want)
		}
	}
	// Huge waits and hold caps are "forever", not an overflow.
	l := memlock.New()
	lk, err := l.Acquire(ctxT(t), "k", dlock.WithWait(math.MaxInt64), dlock.WithMaxHold(math.MaxInt64))
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Err(); err != nil {
		t.Fatalf("lock with a huge hold cap lost at once: %v", err)
	}
	lk.Release(context.Background())
}

// Metadata right at MaxMetadataLen. Without default metadata the user has
// the whole budget; with it, the defaults (host, pid and acquired: 8+13
// bytes) count, and a call over the budget fails with ErrInvalidOption
// naming the size and the limit.
func TestMetadata_LimitCountsTheDefaults(t *testing.T) {
	ctx := context.Background()
	l := memlock.New()
	const k = "note"
	full := strings.Repeat("v", dlock.MaxMetadataLen-len(k))
	lk, err := l.TryAcquire(ctx, "meta/limit", dlock.WithoutDefaultMetadata(), dlock.WithMetadata(k, full))
	if err != nil {
		t.Fatalf("metadata of exactly %d bytes without defaults: %v", dlock.MaxMetadataLen, err)
	}
	lk.Release(ctx)
	_, err = l.TryAcquire(ctx, "meta/limit", dlock.WithoutDefaultMetadata(), dlock.WithMetadata(k, full+"v"))
	if !errors.Is(err, dlock.ErrInvalidOption) || !strings.Contains(err.Error(), strconv.Itoa(dlock.MaxMetadataLen)) {
		t.Errorf("one byte over: %v, want ErrInvalidOption naming %d", err, dlock.MaxMetadataLen)
	}
	// With the defaults: what fits beside host and pid alone is 21 bytes
	// too much (the acquired stamp); the error is ErrInvalidOption.
	host, _ := os.Hostname()
	hostPIDBudget := dlock.MaxMetadataLen - len(dlock.MetaHost) - len(host) - len(dlock.MetaPID) - len(strconv.Itoa(os.Getpid())) - len(k)
	_, err = l.TryAcquire(ctx, "meta/limit", dlock.WithMetadata(k, strings.Repeat("v", hostPIDBudget)))
	if err != nil && (!errors.Is(err, dlock.ErrInvalidOption) || !strings.Contains(err.Error(), "acquired included")) {
		t.Errorf("at the budget beside host and pid: %v, want nil or ErrInvalidOption saying the defaults count", err)
	}
	t.Logf("user metadata that fits beside host and pid (%d bytes): %v", hostPIDBudget+len(k), err)
	fullBudget := hostPIDBudget - len(dlock.MetaAcquired) - len(strconv.FormatInt(time.Now().UnixMilli(), 10))
	lk, err = l.TryAcquire(ctx, "meta/limit", dlock.WithMetadata(k, strings.Repeat("v", fullBudget)))
	if err != nil {
		t.Fatalf("at the budget left beside host, pid and acquired: %v", err)
	}
	lk.Release(ctx)
}
