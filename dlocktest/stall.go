package dlocktest

import (
	"sync"
	"time"
)

// stallTick is the period of a StallMeter's probe, and stallSlack the
// lateness of one wake-up below which it is scheduling jitter, not a
// stall: a busy process delays a 10ms sleep by a few to tens of
// milliseconds, and a call waiting on one timer pays that once, not at
// every probe.
const (
	stallTick  = 10 * time.Millisecond
	stallSlack = 100 * time.Millisecond
)

// A StallMeter measures how long this test process went without running
// its goroutines while a call was under test: on a loaded machine the
// process can be starved of CPU for seconds, and then a call that honours
// its context returns late only because nothing of the process ran. A
// probe goroutine sleeps stallTick at a time; every wake-up more than
// stallSlack late counts as a stall of its lateness.
//
// A deadline check allows OverrunBound plus the stall: a call that waits
// for a client's own timeout instead of its context still fails it, for
// the process ran meanwhile, while a starved one does not.
type StallMeter struct {
	stop    chan time.Time
	done    chan [2]time.Duration
	once    sync.Once
	stalled time.Duration
	longest time.Duration
}

// StartStallMeter starts measuring the stalls after from (a call's
// deadline: a stall before it does not delay a return past it); StopAt
// or Stop ends the measure.
func StartStallMeter(from time.Time) *StallMeter {
	m := &StallMeter{stop: make(chan time.Time, 1), done: make(chan [2]time.Duration, 1)}
	// Read here, not on the probe: a probe that first runs late (the
	// process stalled right after this call) counts that stall too.
	last := time.Now()
	t := time.NewTimer(stallTick)
	go func() {
		defer t.Stop()
		var stalled, longest time.Duration
		// add counts the part within [from, until] of a wake-up's
		// lateness: the process should have run at last+stallTick and
		// ran at now.
		add := func(last, now, until time.Time) {
			if now.Sub(last)-stallTick <= stallSlack {
				return
			}
			due := last.Add(stallTick)
			if due.Before(from) {
				due = from
			}
			if now.After(until) {
				now = until
			}
			if now.After(due) {
				stalled += now.Sub(due)
				longest = max(longest, now.Sub(due))
			}
		}
		for {
			select {
			case end := <-m.stop:
				add(last, time.Now(), end)
				m.done <- [2]time.Duration{stalled, longest}
				return
			case <-t.C:
			}
			now := time.Now()
			add(last, now, now)
			last = now
			t.Reset(stallTick)
		}
	}()
	return m
}

// StopAt ends the measure at end (when the call under test returned: a
// stall after it is not the call's) and returns the time the process was
// stalled. Later calls, and Stop, return the same.
func (m *StallMeter) StopAt(end time.Time) time.Duration {
	m.once.Do(func() {
		m.stop <- end
		r := <-m.done
		m.stalled, m.longest = r[0], r[1]
	})
	return m.stalled
}

// Stop is StopAt now.
func (m *StallMeter) Stop() time.Duration { return m.StopAt(time.Now()) }

// Longest is the longest single stall, once the measure ended.
func (m *StallMeter) Longest() time.Duration { return m.longest }

// Overrun is how far past deadline a call that ended at end returned,
// less the time the process was stalled meanwhile (never below zero).
// Checks compare it with OverrunBound.
func Overrun(deadline, end time.Time, stalled time.Duration) time.Duration {
	return max(0, end.Sub(deadline)-stalled)
}
