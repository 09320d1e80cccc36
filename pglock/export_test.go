package pglock

// ListensThroughPooler reports whether l found a pooler between it and
// PostgreSQL and stopped LISTENing (tests).
func ListensThroughPooler(l *Locker) bool { return l.b.l != nil && l.b.l.pooled.Load() }
