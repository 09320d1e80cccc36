package dlocktest

import (
	"sync"
	"time"
)

// stallTick is the period of a StallMeter's probe, and stallSlack the
// lateness of one probe that still counts as running on time.
const (
	stallTick  = 10 * time.Millisecond
	stallSlack = 5 * time.Millisecond
)

// A StallMeter measures how long this test process went without running
// its goroutines while a call was under test: on a loaded machine the
// process can be starved of CPU for seconds, and then a call that honours
// its context returns late only because nothing of the process ran. A
// probe goroutine sleeps stallTick at a time; every wake-up that comes
// more than stallSlack late adds its lateness.
//
// A deadline check allows OverrunBound plus the stall: a call that waits
// for a client's own timeout instead of its context still fails it, for
// the process ran meanwhile, while a starved one does not.
type StallMeter struct {
	stop    chan struct{}
	done    chan [2]time.Duration
	once    sync.Once
	stalled time.Duration
	longest time.Duration
}

// StartStallMeter starts measuring the stalls that end after from (a
// call's deadline: a stall before it does not delay a return past it);
// Stop ends the measure.
func StartStallMeter(from time.Time) *StallMeter {
	m := &StallMeter{stop: make(chan struct{}), done: make(chan [2]time.Duration, 1)}
	go func() {
		var stalled, longest time.Duration
		// add counts the part after from of a wake-up's lateness: the
		// process should have run at last+stallTick and ran at now.
		add := func(last, now time.Time) {
			if now.Sub(last)-stallTick <= stallSlack {
				return
			}
			due := last.Add(stallTick)
			if due.Before(from) {
				due = from
			}
			if now.After(due) {
				stalled += now.Sub(due)
				longest = max(longest, now.Sub(due))
			}
		}
		t := time.NewTimer(stallTick)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-m.stop:
				add(last, time.Now())
				m.done <- [2]time.Duration{stalled, longest}
				return
			case <-t.C:
			}
			now := time.Now()
			add(last, now)
			last = now
			t.Reset(stallTick)
		}
	}()
	return m
}

// Stop ends the measure and returns the time the process was stalled.
// Later calls return the same.
func (m *StallMeter) Stop() time.Duration {
	m.once.Do(func() {
		close(m.stop)
		r := <-m.done
		m.stalled, m.longest = r[0], r[1]
	})
	return m.stalled
}

// Longest is the longest single stall, once Stop returned.
func (m *StallMeter) Longest() time.Duration { return m.longest }

// Overrun is how far past deadline a call that ended at end returned,
// less the time the process was stalled meanwhile (never below zero).
// Checks compare it with OverrunBound.
func Overrun(deadline, end time.Time, stalled time.Duration) time.Duration {
	return max(0, end.Sub(deadline)-stalled)
}
