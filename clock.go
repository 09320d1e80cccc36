package dlock

import "time"

// clock is an Engine's time source: the deadlines, renewals, hold caps
// and backoff waits of its locks are read and scheduled on it. It is the
// wall clock (realClock) outside tests; the core's own tests drive the
// watchdog's scheduling with a clock they advance by hand, so that what
// they assert does not depend on how fast the machine is.
type clock interface {
	Now() time.Time
	// AfterFunc runs f on its own goroutine once d has passed.
	AfterFunc(d time.Duration, f func()) clockTimer
	// NewTimer returns a timer whose channel receives once d has passed.
	NewTimer(d time.Duration) (clockTimer, <-chan time.Time)
}

// clockTimer is the part of *time.Timer the core uses.
type clockTimer interface {
	Stop() bool
	Reset(d time.Duration) bool
}

// realClock is the wall clock.
type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) AfterFunc(d time.Duration, f func()) clockTimer { return time.AfterFunc(d, f) }

func (realClock) NewTimer(d time.Duration) (clockTimer, <-chan time.Time) {
	t := time.NewTimer(d)
	return t, t.C
}

// clockSince and clockUntil are time.Since and time.Until on c.
func clockSince(c clock, t time.Time) time.Duration { return c.Now().Sub(t) }
func clockUntil(c clock, t time.Time) time.Duration { return t.Sub(c.Now()) }
