package dlock

import (
	"math"
	"math/rand/v2"
	"time"
)

// Backoff gives the delay before polling attempt n (n starts at 1). Waiting
// backends that are notified of releases use it only as a fallback, so a
// missed notification delays a waiter by at most one backoff step.
type Backoff interface {
	Next(attempt int) time.Duration
}

// DefaultBackoff is ExpBackoff{Min: 5ms, Max: 500ms}.
var DefaultBackoff Backoff = ExpBackoff{Min: 5 * time.Millisecond, Max: 500 * time.Millisecond}

// ExpBackoff doubles from Min up to Max and applies "equal jitter": the
// delay is uniformly random in [d/2, d], so contenders spread out without
// ever retrying immediately.
type ExpBackoff struct {
	Min, Max time.Duration
}

// Next implements Backoff.
func (b ExpBackoff) Next(attempt int) time.Duration {
	lo, hi := b.Min, b.Max
	if lo <= 0 {
		lo = time.Millisecond
	}
	if hi < lo {
		hi = lo
	}
	d := lo
	for i := 1; i < attempt && d < hi; i++ {
		if d > hi/2 { // doubling would pass hi (or overflow)
			d = hi
			break
		}
		d *= 2
	}
	if d > hi {
		d = hi
	}
	half := d / 2
	return half + rand.N(d-half) // d-half ≥ 1 and cannot overflow
}

// ConstBackoff always waits the same duration, with ±jitter.
type ConstBackoff struct {
	Delay  time.Duration
	Jitter time.Duration
}

// Next implements Backoff.
func (b ConstBackoff) Next(int) time.Duration {
	d := b.Delay
	if j := min(b.Jitter, math.MaxInt64/4); j > 0 {
		r := rand.N(2*j+1) - j
		if r > 0 && d > math.MaxInt64-r { // saturate instead of overflowing
			return math.MaxInt64
		}
		d += r
	}
	if d < 0 {
		d = 0
	}
	return d
}
