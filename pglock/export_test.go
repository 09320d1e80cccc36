package pglock

import "time"

// ListensThroughPooler reports whether l found a pooler between it and
// PostgreSQL and stopped LISTENing (tests).
func ListensThroughPooler(l *Locker) bool { return l.b.l != nil && l.b.l.gaveUp() == errPooled }

// ListenGivenUp is why l tries LISTEN no more; nil if it still does
// (tests).
func ListenGivenUp(l *Locker) error { return l.b.l.gaveUp() }

// SetListenLinger sets how long l's LISTEN connection outlives its last
// waiter (tests).
func SetListenLinger(l *Locker, d time.Duration) {
	l.b.l.mu.Lock()
	l.b.l.linger = d
	l.b.l.mu.Unlock()
}
