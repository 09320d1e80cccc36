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
