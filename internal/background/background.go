// Package background runs dlock's bounded background work (undoing an
// abandoned attempt, finishing a request whose caller left, releasing a
// lost lock) and lets tests wait for it to end before they look for leaked
// goroutines. Every function run here ends on its own: its requests carry
// their own deadline (DefaultReleaseTimeout) or the client's timeouts.
package background

import (
	"sync"
	"time"
)

// The running work is counted under mu rather than in a sync.WaitGroup:
// work starts at any time (a timer fires, a lock is lost) while a test
// waits, and a WaitGroup forbids an Add from zero concurrent with a Wait
// (the race detector reports it).
var (
	mu      sync.Mutex
	running int
	idle    chan struct{} // closed when running drops to zero
	pending = map[*time.Timer]func(){}
)

func start() {
	mu.Lock()
	defer mu.Unlock()
	if running == 0 {
		idle = make(chan struct{})
	}
	running++
}

func done() {
	mu.Lock()
	defer mu.Unlock()
	running--
	if running == 0 {
		close(idle)
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
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		mu.Lock()
		if running == 0 {
			mu.Unlock()
			return true
		}
		ch := idle
		mu.Unlock()
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
