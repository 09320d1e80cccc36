package zklock

// WatchEvents returns the number of watch events zklock's waiters and
// holders have received so far (tests: a release wakes one waiter).
func WatchEvents() int64 { return watchEvents.Load() }
