package redislock

import (
	"context"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// Watch implements driver.Watcher: the waiter listens on a channel of its
// own; its failed attempts queue it, and each release wakes the first
// queued waiter still listening, so one waiter retries, not all. Closing
// the subscription (Acquire returned) removes the waiter from the queue in
// the background, once none of its attempts is in flight.
func (b *backend) Watch(ctx context.Context, key string) (driver.Subscription, error) {
	if tair, _ := b.proto.known(); tair {
		// Every waiter listens on the key's free channel: a release
		// wakes them all, and the first to retry takes the key.
		s, err := b.node.WatchFree(ctx, key)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
	id := dlock.NewOwner()[:16]
	s, err := b.node.Watch(ctx, key, id)
	if err != nil {
		return nil, err
	}
	return b.subscription(key, id, s), nil
}

// Ready implements driver.ReadyWatcher: a channel a granted wait of key
// left listening (see idleWaiters), handed to the next wait of key, whose
// first attempt then queues it.
func (b *backend) Ready(key string) driver.Subscription {
	if tair, _ := b.proto.known(); tair {
		return nil
	}
	id, s := b.idle.take(key)
	if s == nil {
		return nil
	}
	return b.subscription(key, id, s)
}

func (b *backend) subscription(key, id string, s *redisproto.Subscription) *subscription {
	return &subscription{Subscription: s, b: b, key: key, w: b.waiters.Add(key, id, b.node), id: id}
}

// subscription is a waiter's: driver.Subscription and driver.WaitIDer.
type subscription struct {
	*redisproto.Subscription
	b    *backend
	key  string
	w    *redisproto.Waiter
	id   string
	once sync.Once
}

// WaitID implements driver.WaitIDer.
func (s *subscription) WaitID() string { return s.id }

// Close ends the wait: the waiter leaves the queue (in the background,
// once none of its attempts is in flight) and its channel is unsubscribed,
// unless the wait ended granted with nothing in flight: then no queue
// holds its id, and the channel stays subscribed for a while for the next
// wait of the same key (Ready). It never waits on the network.
func (s *subscription) Close() {
	s.once.Do(func() {
		if s.w.Leave() && s.Subscription.Confirmed() && s.b.idle.put(s.key, s.id, s.Subscription) {
			return
		}
		s.Subscription.Close()
	})
}

// Bounds of the channels kept listening between waits.
const (
	// idleWaitLinger is how long a channel stays subscribed with nobody
	// waiting on it: a key contended now is waited for again within
	// milliseconds, one waited for once costs its channel this long.
	idleWaitLinger = 500 * time.Millisecond
	// maxIdleWaits caps the channels kept per Locker.
	maxIdleWaits = 64
)

// idleWaiters are the channels of granted waits, kept subscribed for
// idleWaitLinger so that the next wait of the same key skips the
// SUBSCRIBE and its confirmation, and queues with its first attempt. A
// channel is kept only when no queue can hold its id (the grant removed
// it, and no attempt of the wait is in flight): a release never wakes a
// kept channel, so keeping it delays nobody.
type idleWaiters struct {
	mu    sync.Mutex
	byKey map[string][]idleWait
	n     int
	timer *time.Timer // the next sweep, nil when nothing is kept
}

type idleWait struct {
	id    string
	sub   *redisproto.Subscription
	until time.Time
}

// put keeps sub (waiter id's channel for key); false when the Locker
// keeps maxIdleWaits already.
func (iw *idleWaiters) put(key, id string, sub *redisproto.Subscription) bool {
	iw.mu.Lock()
	defer iw.mu.Unlock()
	if iw.n >= maxIdleWaits {
		return false
	}
	if iw.byKey == nil {
		iw.byKey = map[string][]idleWait{}
	}
	iw.byKey[key] = append(iw.byKey[key], idleWait{id: id, sub: sub, until: time.Now().Add(idleWaitLinger)})
	iw.n++
	if iw.timer == nil {
		iw.timer = time.AfterFunc(idleWaitLinger, iw.sweep)
	}
	return true
}

// take returns a kept channel of key that is still confirmed, with its
// waiter id, emptied of notices from before; nil when there is none.
func (iw *idleWaiters) take(key string) (string, *redisproto.Subscription) {
	iw.mu.Lock()
	defer iw.mu.Unlock()
	for ws := iw.byKey[key]; len(ws) > 0; ws = iw.byKey[key] {
		w := ws[len(ws)-1]
		if len(ws) == 1 {
			delete(iw.byKey, key)
		} else {
			iw.byKey[key] = ws[:len(ws)-1]
		}
		iw.n--
		if !w.sub.Confirmed() {
			w.sub.Close()
			continue
		}
		select {
		case <-w.sub.C():
		default:
		}
		return w.id, w.sub
	}
	return "", nil
}

// sweep unsubscribes the channels kept past their linger and schedules
// the next sweep while any remain.
func (iw *idleWaiters) sweep() {
	iw.mu.Lock()
	defer iw.mu.Unlock()
	now := time.Now()
	next := time.Time{}
	for key, ws := range iw.byKey {
		kept := ws[:0]
		for _, w := range ws {
			if now.Before(w.until) {
				kept = append(kept, w)
				if next.IsZero() || w.until.Before(next) {
					next = w.until
				}
				continue
			}
			w.sub.Close() // never waits on the network
			iw.n--
		}
		if len(kept) == 0 {
			delete(iw.byKey, key)
		} else {
			iw.byKey[key] = kept
		}
	}
	if next.IsZero() {
		iw.timer = nil
		return
	}
	iw.timer = time.AfterFunc(next.Sub(now), iw.sweep)
}
