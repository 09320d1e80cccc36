package dlock_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/dlock-go/dlock"
)

// FuzzNewConfig checks that no key or option value makes NewConfig panic,
// and that whatever it accepts is within the documented limits (no backend
// can overflow on it). The seed corpus is in testdata/fuzz/FuzzNewConfig.
func FuzzNewConfig(f *testing.F) {
	f.Add("k", int64(0), int64(0), int64(0), 0.0, int64(0), int64(0))
	f.Add("jobs/a/b", int64(time.Second), int64(time.Minute), int64(time.Hour), 0.01, int64(2*time.Millisecond), int64(0))
	f.Add("}x", int64(dlock.MaxTTL), int64(-1), int64(-1), math.NaN(), int64(-1), int64(100*time.Millisecond))
	f.Add("\xff", int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64), math.Inf(1), int64(math.MaxInt64), int64(math.MinInt64))
	f.Add(strings.Repeat("k", dlock.MaxKeyLen+1), int64(math.MinInt64), int64(0), int64(0), 0.4999, int64(0), int64(time.Second))
	f.Fuzz(func(t *testing.T, key string, ttl, wait, maxHold int64, factor float64, driftMin, minTTL int64) {
		opts := []dlock.Option{dlock.WithDrift(factor, time.Duration(driftMin))}
		if ttl != 0 {
			opts = append(opts, dlock.WithTTL(time.Duration(ttl)))
		}
		opts = append(opts, dlock.WithWait(time.Duration(wait)), dlock.WithMaxHold(time.Duration(maxHold)))
		c, err := dlock.NewConfig(key, time.Duration(minTTL), opts...)
		if err != nil {
			if !errors.Is(err, dlock.ErrInvalidKey) && !errors.Is(err, dlock.ErrInvalidTTL) && !errors.Is(err, dlock.ErrInvalidOption) {
				t.Fatalf("error %v wraps no documented sentinel", err)
			}
			return
		}
		if key == "" || len(key) > dlock.MaxKeyLen || !utf8.ValidString(key) || strings.IndexByte(key, 0) >= 0 {
			t.Fatalf("invalid key %q accepted", key)
		}
		lo := max(time.Duration(minTTL), 0)
		if lo == 0 {
			lo = dlock.MinTTL
		}
		if c.TTL < lo || c.TTL > dlock.MaxTTL || c.TTL%time.Millisecond != 0 {
			t.Fatalf("ttl %v accepted (min %v, max %v)", c.TTL, lo, dlock.MaxTTL)
		}
		if d := c.Drift(); d <= 0 || d >= c.TTL/2 {
			t.Fatalf("drift %v for ttl %v", d, c.TTL)
		}
		if c.Wait < 0 || c.MaxHold < 0 || c.Backoff == nil {
			t.Fatalf("config %+v", c)
		}
	})
}

// FuzzValidateKey: ValidateKey never panics and accepts exactly the
// documented keys.
func FuzzValidateKey(f *testing.F) {
	for _, k := range []string{"", "a", "a/b", "}", "{x}", "\x00", "\xff", "ü", strings.Repeat("x", dlock.MaxKeyLen)} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		want := key != "" && len(key) <= dlock.MaxKeyLen && utf8.ValidString(key) && strings.IndexByte(key, 0) < 0
		if err := dlock.ValidateKey(key); (err == nil) != want {
			t.Fatalf("ValidateKey(%q) = %v, want valid=%v", key, err, want)
		}
	})
}
