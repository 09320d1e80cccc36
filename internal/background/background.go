// Package background runs dlock's bounded background work (undoing an
// abandoned attempt, finishing a request whose caller left, releasing a
// lost lock) and lets tests wait for it to end before they look for leaked
// goroutines. Every function run here ends on its own: its requests carry
// their own deadline (DefaultReleaseTimeout) or the client's timeouts.
package background

import (
	"sync"
	"sync/atomic"
	"time"
)

// The running work is counted in an atomic, not a sync.WaitGroup: work
// starts at any time (a timer fires, a lock is lost) while a test waits,
// and a WaitGroup forbids an Add from zero concurrent with a Wait (the race
// detector reports it). Go and its end touch only the counter unless a
// Wait is waiting: every backend call bounded by a context runs here, on
// every Locker of the process at once.
var (
	running atomic.Int64
	waiting atomic.Int32 // Waits in progress

	mu      sync.Mutex
	idle    chan struct{} // made by a Wait; closed when running drops to zero
	pending = map[*time.Timer]func(){}
)

func start() { running.Add(1) }

func done() {
	if running.Add(-1) == 0 && waiting.Load() > 0 {
		mu.Lock()
		if idle != nil {
			close(idle)
			idle = nil
		}
		mu.Unlock()
	}
}

// Go runs f on a new goroutine, counted until it returns.
func Go(f func()) {
	start()
	go func() {
		defer done()
		f()
	}()
}

// Wait blocks until no background work is running, or for at most d, and
// reports whether everything ended.
func Wait(d time.Duration) bool {
	waiting.Add(1)
	defer waiting.Add(-1)
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		// The channel is made before the counter is read: a done that
		// brings it to zero after the read sees this Wait (waiting) and
		// closes the channel.
		mu.Lock()
		if idle == nil {
			idle = make(chan struct{})
		}
		ch := idle
		mu.Unlock()
		if running.Load() == 0 {
			return true
		}
		select {
		case <-ch:
			// Work may have started again since; look once more.
		case <-t.C:
			return false
		}
	}
}

// AfterFunc runs f on its own goroutine after d, counted from now: Wait
// waits for it (the release RunOnce defers to atLeastFor) and Flush runs
// it at once.
func AfterFunc(d time.Duration, f func()) {
	start()
	mu.Lock()
	defer mu.Unlock()
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		defer done()
		mu.Lock()
		delete(pending, t)
		mu.Unlock()
		f()
	})
	pending[t] = f
}

// Flush runs the work AfterFunc scheduled that has not started yet, now
// (a test binary ending: a lock RunOnce keeps for a minute is released
// before the servers stop).
func Flush() {
	mu.Lock()
	defer mu.Unlock()
	for t, f := range pending {
		if t.Stop() {
			delete(pending, t)
			go func() {
				defer done()
				f()
			}()
		}
	}
}
