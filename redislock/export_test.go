package redislock

// BreakListening reports whether l's break subscription has been
// confirmed (a notice heard: the confirmation counts as one) and no read
// of a held lock's key, which a notice starts, is queued or running
// (tests: nothing of the break listening is in flight).
func BreakListening(l *Locker) bool {
	bc := &l.b.breakChecks
	bc.mu.Lock()
	idle := !bc.running && len(bc.pending) == 0
	bc.mu.Unlock()
	return l.b.breaks.gen.Load() > 0 && idle
}
