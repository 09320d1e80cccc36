package redisproto

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/background"
)

// maxPendingDequeues caps a Node's backlog of waiters to dequeue (while its
// link is hung). Past it a departed waiter stays queued: a release skips
// it (standalone) or reserves the key for it for HandoffReserve (Cluster),
// and the queue expires a minute after its last failed attempt.
const maxPendingDequeues = 1024

// Waiters tracks the waiters of one backend, so that a waiter that leaves
// (its subscription is closed: Acquire returned) is removed from the queues
// its attempts put it in, and only once none of its attempts is in flight
// (an attempt abandoned at its caller's deadline may still queue it).
type Waiters struct {
	m sync.Map // wait id -> *Waiter
}

// Waiter is one waiting Acquire's queue entry for key on nodes.
type Waiter struct {
	ws    *Waiters
	key   string
	id    string
	nodes []*Node

	mu       sync.Mutex
	inflight int
	left     bool
	dequeued bool
	granted  bool // its last attempt begun was granted
}

// Add registers waiter id for key on nodes.
func (ws *Waiters) Add(key, id string, nodes ...*Node) *Waiter {
	w := &Waiter{ws: ws, key: key, id: id, nodes: nodes}
	ws.m.Store(id, w)
	return w
}

// Begin marks an attempt made with wait id as in flight and returns the
// function that marks it done. An unknown id (no wait id, or a waiter that
// left already) gives a no-op.
func (ws *Waiters) Begin(id string) (end func()) {
	if id == "" {
		return func() {}
	}
	v, ok := ws.m.Load(id)
	if !ok {
		return func() {}
	}
	w := v.(*Waiter)
	w.mu.Lock()
	w.inflight++
	w.granted = false // only the last attempt's grant dequeued the id
	w.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			w.mu.Lock()
			w.inflight--
			w.mu.Unlock()
			w.maybeDequeue()
		})
	}
}

// Granted records that an attempt made with wait id was granted: the
// grant removed the id from the key's queue (every acquisition script
// does). A later attempt with the id (the grant was refused by the core,
// say, and the wait went on) clears it again in Begin. An unknown id is
// ignored.
func (ws *Waiters) Granted(id string) {
	if id == "" {
		return
	}
	if v, ok := ws.m.Load(id); ok {
		w := v.(*Waiter)
		w.mu.Lock()
		w.granted = true
		w.mu.Unlock()
	}
}

// Leave marks the waiter gone: it is removed from its queues now, or when
// its last attempt in flight returns. It never waits on the network.
// clean reports that nothing needs removing: an attempt of the waiter's
// was granted (which dequeued it) and none is in flight, so no queue
// holds its id, and its channel may serve another wait of the same key.
func (w *Waiter) Leave() (clean bool) {
	w.ws.m.Delete(w.id)
	w.mu.Lock()
	w.left = true
	if w.granted && w.inflight == 0 && !w.dequeued {
		w.dequeued, clean = true, true
	}
	w.mu.Unlock()
	if !clean {
		w.maybeDequeue()
	}
	return clean
}

func (w *Waiter) maybeDequeue() {
	w.mu.Lock()
	due := w.left && w.inflight == 0 && !w.dequeued
	if due {
		w.dequeued = true
	}
	w.mu.Unlock()
	if due {
		for _, n := range w.nodes {
			n.dequeue(w.key, w.id)
		}
	}
}

// dequeuer removes departed waiters from their queues in the background:
// one goroutine per Node at most, sending everything pending as one
// pipeline of ZREMs per round, and ending when nothing is pending. A
// removal that fails (a stalled or cut link) is retried with backoff for
// up to dequeueRetryFor, or until the client is closed: a departed
// waiter left queued costs every later release a pop (standalone) or a
// reservation for nobody (Cluster).
type dequeuer struct {
	mu      sync.Mutex
	pending []dequeueEntry
	running bool
}

type dequeueEntry struct {
	queue, id string
	failed    time.Time // first failure; zero before any
	tries     int
}

const (
	// dequeueRetryFor bounds the retries of a failed removal. The queue
	// itself expires a minute after the last failed attempt on the key.
	dequeueRetryFor = 30 * time.Second
	// dequeueBackoffMax caps the wait between retries.
	dequeueBackoffMax = 2 * time.Second
)

// dequeue queues the removal of waiter id from key's queue.
func (n *Node) dequeue(key, id string) {
	d := &n.dq
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.pending) >= maxPendingDequeues {
		return
	}
	d.pending = append(d.pending, dequeueEntry{queue: n.WaitersKey(key), id: id})
	if !d.running {
		d.running = true
		background.Go(n.drainDequeues)
	}
}

func (n *Node) drainDequeues() {
	d := &n.dq
	for {
		d.mu.Lock()
		batch := d.pending
		d.pending = nil
		if len(batch) == 0 {
			d.running = false
			d.mu.Unlock()
			return
		}
		d.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		cmds := make([]*redis.IntCmd, len(batch))
		_, _ = n.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, e := range batch {
				cmds[i] = p.ZRem(ctx, e.queue, e.id)
			}
			return nil
		})
		cancel()
		var retry []dequeueEntry
		wait := time.Duration(0)
		now := time.Now()
		for i, c := range cmds {
			err := c.Err()
			if err == nil || errors.Is(err, redis.ErrClosed) {
				continue
			}
			e := batch[i]
			if e.failed.IsZero() {
				e.failed = now
			}
			if now.Sub(e.failed) >= dequeueRetryFor {
				continue // left to the release's skipping and the expiry
			}
			e.tries++
			retry = append(retry, e)
			wait = max(wait, min(100*time.Millisecond<<min(e.tries, 8), dequeueBackoffMax))
		}
		if len(retry) > 0 {
			time.Sleep(wait)
			d.mu.Lock()
			d.pending = append(retry, d.pending...)
			if len(d.pending) > maxPendingDequeues {
				d.pending = d.pending[:maxPendingDequeues]
			}
			d.mu.Unlock()
		}
	}
}
