package dlock

import (
	"slices"
	"sort"
	"sync"
	"time"
)

// fakeClock is a clock that moves only when a test moves it. Timers fire
// when the test moves the clock past them, one at a time, in the order
// they are due, each with the clock set to its due time. An AfterFunc's
// function runs on a goroutine of its own, as with time.AfterFunc, and
// the test's call waits until it returns or parks (Park: it blocks in a
// call only the test can end, such as a hung renewal). So the watchdog's
// passes run when the test says, and what they decide depends on nothing
// but the clock's readings.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	fired  int           // timers fired so far
	parked chan struct{} // closed (and replaced) when a call parks
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Unix(1_800_000_000, 0), parked: make(chan struct{})}
}

// Park tells the clock that a call is about to block until the test ends
// it (a fake backend's hung call): a timer function that is running stops
// being waited for. A fake backend calls it from its hung calls, which a
// watchdog pass makes on its own goroutine.
func (c *fakeClock) Park() {
	c.mu.Lock()
	close(c.parked)
	c.parked = make(chan struct{})
	c.mu.Unlock()
}

type fakeTimer struct {
	c      *fakeClock
	at     time.Time
	f      func()         // AfterFunc
	ch     chan time.Time // NewTimer
	active bool
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) clockTimer {
	return c.add(&fakeTimer{c: c, f: f}, d)
}

func (c *fakeClock) NewTimer(d time.Duration) (clockTimer, <-chan time.Time) {
	t := c.add(&fakeTimer{c: c, ch: make(chan time.Time, 1)}, d)
	return t, t.ch
}

func (c *fakeClock) add(t *fakeTimer, d time.Duration) *fakeTimer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t.at, t.active = c.now.Add(d), true
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.active
	t.active = false
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.active
	t.at, t.active = t.c.now.Add(d), true
	if !slices.Contains(t.c.timers, t) {
		t.c.timers = append(t.c.timers, t)
	}
	return was
}

// Spend moves the clock forward by d without firing a timer: the time a
// piece of work in progress takes (losing a lock, say).
func (c *fakeClock) Spend(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// next takes the earliest active timer due by limit (any, if limit is
// zero) out of the list and sets the clock to its due time if that is
// later; nil if there is none.
func (c *fakeClock) next(limit time.Time) *fakeTimer {
	c.mu.Lock()
	defer c.mu.Unlock()
	live := c.timers[:0]
	for _, t := range c.timers {
		if t.active {
			live = append(live, t)
		}
	}
	c.timers = live
	if len(live) == 0 {
		return nil
	}
	sort.SliceStable(live, func(i, j int) bool { return live[i].at.Before(live[j].at) })
	t := live[0]
	if !limit.IsZero() && t.at.After(limit) {
		return nil
	}
	c.timers = live[1:]
	t.active = false
	if t.at.After(c.now) {
		c.now = t.at
	}
	c.fired++
	return t
}

func (t *fakeTimer) fire(now time.Time) {
	if t.f != nil {
		t.c.mu.Lock()
		parked := t.c.parked
		t.c.mu.Unlock()
		done := make(chan struct{})
		go func() {
			defer close(done)
			t.f()
		}()
		select {
		case <-done:
		case <-parked:
		}
		return
	}
	select {
	case t.ch <- now:
	default:
	}
}

// Step fires the earliest timer (moving the clock to its time if that is
// later) and reports whether there was one.
func (c *fakeClock) Step() bool {
	t := c.next(time.Time{})
	if t == nil {
		return false
	}
	t.fire(c.Now())
	return true
}

// AdvanceTo fires, in order, every timer due by at, then sets the clock
// to at (if it is not past it already).
func (c *fakeClock) AdvanceTo(at time.Time) {
	for {
		t := c.next(at)
		if t == nil {
			break
		}
		t.fire(c.Now())
	}
	c.mu.Lock()
	if at.After(c.now) {
		c.now = at
	}
	c.mu.Unlock()
}

// Advance is AdvanceTo(Now()+d).
func (c *fakeClock) Advance(d time.Duration) { c.AdvanceTo(c.Now().Add(d)) }

// pending reports the due time of the earliest active timer.
func (c *fakeClock) pending() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var first time.Time
	for _, t := range c.timers {
		if t.active && (first.IsZero() || t.at.Before(first)) {
			first = t.at
		}
	}
	return first, !first.IsZero()
}
