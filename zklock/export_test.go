package zklock

import "github.com/go-zookeeper/zk"

// WatchEvents returns the number of watch events the waiters and holders
// of the Lockers ls have received so far (tests: a release wakes one
// waiter).
func WatchEvents(ls ...*Locker) int64 {
	var n int64
	for _, l := range ls {
		n += l.b.watchEvents.Load()
	}
	return n
}

// Hooks are test hooks on one Locker's steps; a nil field is no hook.
type Hooks struct {
	// BeforeCreate runs on a queue node create's goroutine before the
	// request is sent (blocking in it is a scheduler that runs the
	// create late).
	BeforeCreate func()
	// AfterCreate runs on that goroutine once the create returned.
	AfterCreate func(err error)
	// Aborted runs when the Locker's Abort (the undo of an attempt whose
	// outcome is unknown) returns.
	Aborted func(err error)
	// BeforeOrphanDelete runs before the deletion of a node nobody uses
	// (a refused or abandoned attempt's): blocking in it holds the node
	// in the queue.
	BeforeOrphanDelete func()
	// ChildWatch replaces the watch a semaphore's first waiting permit
	// sets on the key's children (returning a channel that never fires
	// is a watch whose event was lost).
	ChildWatch func(<-chan zk.Event) <-chan zk.Event
	// Request runs before each request is sent, with its name ("sync",
	// "list", ...), on the caller's goroutine.
	Request func(what string)
	// Waiting runs on the caller's goroutine once a request was started,
	// before the Locker waits for its reply; replied reports whether the
	// reply is there (blocking in it is a caller that was not running
	// while the reply came and its timeout passed).
	Waiting func(replied func() bool)
}

// SetHooks installs h on l (nil removes them).
func SetHooks(l *Locker, h *Hooks) {
	if h == nil {
		l.b.hooks.Store(nil)
		return
	}
	l.b.hooks.Store(&testHooks{beforeCreate: h.BeforeCreate, afterCreate: h.AfterCreate, aborted: h.Aborted, childWatch: h.ChildWatch, beforeOrphanDelete: h.BeforeOrphanDelete, request: h.Request, waiting: h.Waiting})
}
