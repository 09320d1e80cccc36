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

var wg sync.WaitGroup

// Go runs f on a new goroutine, counted until it returns.
func Go(f func()) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		f()
	}()
}

// Wait blocks until no background work is running, or for at most d, and
// reports whether everything ended.
func Wait(d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

var (
	mu      sync.Mutex
	pending = map[*time.Timer]func(){}
)

// AfterFunc runs f on its own goroutine after d, counted from now: Wait
// waits for it (the release RunOnce defers to atLeastFor) and Flush runs
// it at once.
func AfterFunc(d time.Duration, f func()) {
	wg.Add(1)
	mu.Lock()
	defer mu.Unlock()
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		defer wg.Done()
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
				defer wg.Done()
				f()
			}()
		}
	}
}
