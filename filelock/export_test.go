package filelock

// Notified reports whether this process subscribes to the wake-ups of
// key in l's directory (a waiter's or a held lock's subscription) with
// the directory's inotify reader running.
func Notified(l *Locker, key string) bool {
	wakeups.mu.Lock()
	defer wakeups.mu.Unlock()
	d := wakeups.dirs[l.dir]
	return d != nil && d.note != nil && len(d.subs[fileID(key)]) > 0
}
