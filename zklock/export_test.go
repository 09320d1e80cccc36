package zklock

import "time"

// WatchEvents returns the number of watch events zklock's waiters and
// holders have received so far (tests: a release wakes one waiter).
func WatchEvents() int64 { return watchEvents.Load() }

// SetCreateDelay delays every queue node create by d before it is sent
// (0: no delay), as a busy scheduler can.
func SetCreateDelay(d time.Duration) { testCreateDelay.Store(int64(d)) }
