package redislock

import (
	"context"

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
	id := dlock.NewOwner()[:16]
	s, err := b.node.Watch(ctx, key, id)
	if err != nil {
		return nil, err
	}
	return &subscription{Subscription: s, w: b.waiters.Add(key, id, b.node), id: id}, nil
}

// subscription is a waiter's: driver.Subscription and driver.WaitIDer.
type subscription struct {
	*redisproto.Subscription
	w  *redisproto.Waiter
	id string
}

// WaitID implements driver.WaitIDer.
func (s *subscription) WaitID() string { return s.id }

// Close ends the subscription and dequeues the waiter; it never waits on
// the network.
func (s *subscription) Close() {
	s.Subscription.Close()
	s.w.Leave()
}
