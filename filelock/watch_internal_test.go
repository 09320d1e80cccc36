package filelock

import (
	"context"
	"testing"
	"time"
)

const hangInternal = 60 * time.Second

func newBackend(t *testing.T, dir string, opts ...Option) *backend {
	t.Helper()
	l, err := New(dir, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return (*backend)(l)
}

func waitFire(t *testing.T, s interface{ C() <-chan struct{} }, what string) {
	t.Helper()
	select {
	case <-s.C():
	case <-time.After(hangInternal):
		t.Fatalf("hang: %s did not wake the subscription", what)
	}
}

func hubEmpty() bool {
	wakeups.mu.Lock()
	defer wakeups.mu.Unlock()
	return len(wakeups.dirs) == 0
}

// A release through another Locker of the process wakes a waiter without
// inotify or polling.
func TestWatchInProcess(t *testing.T) {
	dir := t.TempDir()
	b := newBackend(t, dir, WithInotify(false), WithPollInterval(time.Hour))
	s, err := b.Watch(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := (*Locker)(newBackend(t, dir)).Expire("k"); err != nil { // free key: no wake
		t.Fatal(err)
	}
	lk, err := (*Locker)(newBackend(t, dir)).TryAcquire(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFire(t, s, "an in-process release")
}

// A record rewritten behind the package's back (as another process does)
// wakes a waiter through inotify.
func TestWatchInotify(t *testing.T) {
	dir := t.TempDir()
	b := newBackend(t, dir, WithPollInterval(time.Hour))
	s, err := b.Watch(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	wakeups.mu.Lock()
	running := wakeups.dirs[b.dir].note != nil
	wakeups.mu.Unlock()
	if !running {
		t.Skip("inotify unavailable here")
	}
	// Another key's record does not wake it. (A slow machine can only make
	// this pass vacuously, never fail: the poll interval is an hour.)
	if err := writeAtomic(b.recordPath(fileID("other")), []byte(`{"key":"other","counter":1}`), false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	select {
	case <-s.C():
		t.Fatal("woken by another key's record")
	default:
	}
	if err := writeAtomic(b.recordPath(fileID("k")), []byte(`{"key":"k","counter":1}`), false); err != nil {
		t.Fatal(err)
	}
	waitFire(t, s, "an inotify event")
	s.Close()
	if !hubEmpty() {
		t.Fatal("hub not empty after the last Close")
	}
}

// With no notification at all, the poll timer fires, repeatedly.
func TestWatchPoll(t *testing.T) {
	b := newBackend(t, t.TempDir(), WithInotify(false), WithPollInterval(5*time.Millisecond))
	s, err := b.Watch(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		waitFire(t, s, "the poll timer")
	}
	s.Close()
	s.Close() // idempotent
	if !hubEmpty() {
		t.Fatal("hub not empty after Close")
	}
}
