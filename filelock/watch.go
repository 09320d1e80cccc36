package filelock

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// Waiting for a held key.
//
// A subscription is woken three ways, each by a non-blocking send on its
// channel:
//
//   - in-process: a release, abort or Expire through any Locker of this
//     process on the same directory wakes the key's subscribers directly
//     (the package-level hub below, keyed by canonical directory and key);
//   - inotify (Linux): while anyone in the process waits on a directory
//     (or holds a lock there long enough to listen for breaks: lease.go),
//     one inotify instance watches it for records (and waiting writers'
//     files) being renamed into place or deleted, which is how every write
//     by any process lands, and wakes the subscribers of that key;
//   - polling: every waiter's subscription also fires on its own timer
//     every poll interval (jittered), so a waiter is never stranded by a missed
//     notification, a filesystem without inotify events, or a lease that
//     simply expires (nobody writes then).
//
// None of this holds a goroutine per subscription: the poll timer is a
// time.AfterFunc that re-arms itself, and the only goroutine is the inotify
// reader of a directory, which exists while at least one subscription on
// that directory wants it and is stopped (and waited for) by the Close of
// the last one.

// hub routes wake-ups to the subscriptions of this process.
type hub struct {
	mu   sync.Mutex
	dirs map[string]*dirWatch
}

// dirWatch is the subscriptions on one directory.
type dirWatch struct {
	subs     map[string]map[*subscription]struct{} // file id -> subscriptions
	n        int                                   // subscriptions in subs
	wantNote int                                   // subscriptions that want inotify
	note     *dirNotifier                          // running inotify reader, or nil
	noteErr  bool                                  // inotify failed here: poll only
}

var wakeups = &hub{dirs: map[string]*dirWatch{}}

func (h *hub) add(s *subscription) {
	h.mu.Lock()
	defer h.mu.Unlock()
	d := h.dirs[s.dir]
	if d == nil {
		d = &dirWatch{subs: map[string]map[*subscription]struct{}{}}
		h.dirs[s.dir] = d
	}
	set := d.subs[s.id]
	if set == nil {
		set = map[*subscription]struct{}{}
		d.subs[s.id] = set
	}
	set[s] = struct{}{}
	d.n++
	if !s.notify {
		return
	}
	d.wantNote++
	if d.note == nil && !d.noteErr {
		dir := s.dir
		n, err := startNotifier(dir, func(name string) {
			if id, ok := strings.CutSuffix(name, leaseSuffix); ok {
				h.wake(dir, id)
			} else if id, ok := strings.CutSuffix(name, writersSuffix); ok {
				h.wake(dir, id) // a waiting writer left: readers may go
			}
		}, func() { h.wakeAll(dir) })
		if err != nil {
			d.noteErr = true // waiters on this directory poll
		} else {
			d.note = n
		}
	}
}

func (h *hub) remove(s *subscription) {
	var stop *dirNotifier
	h.mu.Lock()
	if d := h.dirs[s.dir]; d != nil {
		if set := d.subs[s.id]; set != nil {
			if _, ok := set[s]; ok {
				delete(set, s)
				d.n--
				if s.notify {
					d.wantNote--
				}
			}
			if len(set) == 0 {
				delete(d.subs, s.id)
			}
		}
		if d.wantNote == 0 && d.note != nil {
			stop, d.note = d.note, nil
		}
		if d.n == 0 {
			delete(h.dirs, s.dir)
		}
	}
	h.mu.Unlock()
	if stop != nil {
		stop.close() // waits for the reader goroutine, outside h.mu
	}
}

// wake fires the subscriptions of record id in dir.
func (h *hub) wake(dir, id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if d := h.dirs[dir]; d != nil {
		for s := range d.subs[id] {
			s.fire()
		}
	}
}

// wakeAll fires every subscription in dir (after an inotify overflow).
func (h *hub) wakeAll(dir string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if d := h.dirs[dir]; d != nil {
		for _, set := range d.subs {
			for s := range set {
				s.fire()
			}
		}
	}
}

// wake tells this process's waiters on key that it may be free.
func (b *backend) wake(key string) { wakeups.wake(b.dir, fileID(key)) }

// Watch implements driver.Watcher. The in-process registration and the
// inotify watch are in place when Watch returns, so a release after it is
// heard.
func (b *backend) Watch(_ context.Context, key string) (driver.Subscription, error) {
	s := &subscription{dir: b.dir, id: fileID(key), notify: b.opts.inotify, poll: b.opts.poll, ch: make(chan struct{}, 1)}
	wakeups.add(s)
	s.mu.Lock()
	s.timer = time.AfterFunc(jitter(s.poll), s.tick)
	s.mu.Unlock()
	return s, nil
}

// subscription is one waiter's interest in a key.
type subscription struct {
	dir, id string
	notify  bool
	poll    time.Duration
	ch      chan struct{}

	mu     sync.Mutex
	closed bool
	timer  *time.Timer
}

func (s *subscription) C() <-chan struct{} { return s.ch }

func (s *subscription) fire() {
	select {
	case s.ch <- struct{}{}:
	default:
	}
}

// tick is the poll timer's function: fire, then re-arm unless closed.
func (s *subscription) tick() {
	s.fire()
	s.mu.Lock()
	if !s.closed {
		s.timer.Reset(jitter(s.poll))
	}
	s.mu.Unlock()
}

// Close stops the poll timer and unregisters; it is idempotent. A tick
// already running finishes without re-arming.
func (s *subscription) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	if s.timer != nil { // nil for a lease's subscription (Bind): no polling
		s.timer.Stop()
	}
	s.mu.Unlock()
	wakeups.remove(s)
}

// jitter returns d ±25%.
func jitter(d time.Duration) time.Duration {
	return d*3/4 + rand.N(d/2+1)
}
