package dlocktest

import (
	"sync"

	"github.com/dlock-go/dlock"
)

// Recorder is a dlock.Observer that keeps every Event it is given, for
// tests of what a Locker or a guard reports. The zero Recorder is ready;
// it is safe for concurrent use.
//
//	var rec dlocktest.Recorder
//	l := memlock.New(dlock.WithObserver(&rec))
type Recorder struct {
	mu sync.Mutex
	ev []dlock.Event
}

var _ dlock.Observer = (*Recorder)(nil)

// Observe implements dlock.Observer.
func (r *Recorder) Observe(e dlock.Event) {
	r.mu.Lock()
	r.ev = append(r.ev, e)
	r.mu.Unlock()
}

// Events returns a copy of the events seen so far, oldest first.
func (r *Recorder) Events() []dlock.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]dlock.Event(nil), r.ev...)
}

// Take returns the events seen so far and forgets them.
func (r *Recorder) Take() []dlock.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.ev
	r.ev = nil
	return ev
}

// Last returns the newest event of kind k, and false if there is none.
func (r *Recorder) Last(k dlock.EventKind) (dlock.Event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.ev) - 1; i >= 0; i-- {
		if r.ev[i].Kind == k {
			return r.ev[i], true
		}
	}
	return dlock.Event{}, false
}
