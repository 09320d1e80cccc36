package redisx

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/background"
)

// confirmTimeout bounds how long Watch waits for Redis to confirm a
// SUBSCRIBE before the waiter proceeds on polling alone.
const confirmTimeout = 2 * time.Second

// requestTimeout bounds the context of the hub's background SUBSCRIBE and
// UNSUBSCRIBE requests (a client honours it while dialling or waiting for
// its PubSub mutex; its read timeout bounds the rest).
const requestTimeout = 5 * time.Second

// hub multiplexes the release channels of all waiters of one Locker over a
// single pub/sub connection. The connection and its reader goroutine exist
// only while someone waits: the last subscription's Close tears them down.
//
// Nothing a caller waits for blocks on the connection. go-redis serialises
// the methods of a PubSub on one mutex, which a (re)connection holds while
// it dials and handshakes: on a stalled link, SUBSCRIBE, UNSUBSCRIBE and
// Close can each wait for the client's read timeout and retries. So watch
// waits for a SUBSCRIBE at most confirmTimeout (or its context), and Close
// only updates the hub's maps: the UNSUBSCRIBE or the closing of the
// connection runs in the background. hub.mu is never held across a call
// into the PubSub.
type hub struct {
	client redis.UniversalClient

	mu sync.Mutex
	ps *redis.PubSub
	// channel -> live subscriptions
	subs map[string]map[*Subscription]struct{}
	// channel -> closed when Redis confirms the SUBSCRIBE
	confirmed map[string]chan struct{}
}

func newHub(c redis.UniversalClient) *hub {
	return &hub{client: c, subs: map[string]map[*Subscription]struct{}{}, confirmed: map[string]chan struct{}{}}
}

// Subscription is a live interest in a release channel.
type Subscription struct {
	h       *hub
	channel string
	ch      chan struct{}
	once    sync.Once
}

// C receives (without blocking the sender) when the channel publishes.
func (s *Subscription) C() <-chan struct{} { return s.ch }

// Close ends the subscription. It never waits on the network.
func (s *Subscription) Close() { s.once.Do(func() { s.h.unwatch(s) }) }

func (s *Subscription) notify() {
	select {
	case s.ch <- struct{}{}:
	default:
	}
}

// watch subscribes to channel and waits (bounded by confirmTimeout and
// ctx) for the confirmation, so that a release published after watch
// returns is heard. Past confirmTimeout it returns the subscription
// unconfirmed: the waiter's polling covers a message missed meanwhile.
func (h *hub) watch(ctx context.Context, channel string, ch chan struct{}) (*Subscription, error) {
	s := &Subscription{h: h, channel: channel, ch: ch}
	h.mu.Lock()
	if h.ps == nil {
		// No connection is made before the first SUBSCRIBE or Receive.
		h.ps = h.client.Subscribe(context.WithoutCancel(ctx))
		ps := h.ps
		background.Go(func() { h.read(ps) })
	}
	set := h.subs[channel]
	first := set == nil
	if first {
		set = map[*Subscription]struct{}{}
		h.subs[channel] = set
		h.confirmed[channel] = make(chan struct{})
	}
	set[s] = struct{}{}
	confirmed := h.confirmed[channel]
	ps := h.ps
	h.mu.Unlock()
	var subscribed chan error
	if first {
		// Waiter channels are unique per waiter, so this SUBSCRIBE cannot
		// race an UNSUBSCRIBE of the same channel for another waiter.
		subscribed = make(chan error, 1)
		background.Go(func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
			defer cancel()
			subscribed <- ps.Subscribe(sctx, channel)
		})
	}
	t := time.NewTimer(confirmTimeout)
	defer t.Stop()
	for {
		select {
		case err := <-subscribed:
			if err != nil {
				s.Close()
				return nil, err
			}
			subscribed = nil // sent; wait for the confirmation
		case <-confirmed:
			return s, nil
		case <-t.C: // proceed; the polling fallback covers a missed message
			return s, nil
		case <-ctx.Done():
			s.Close()
			return nil, ctx.Err()
		}
	}
}

// unwatch removes s. When s was the channel's last listener the channel is
// unsubscribed, and when it was the hub's last the connection is closed:
// both in the background, so that Close returns at once even on a stalled
// link.
func (h *hub) unwatch(s *Subscription) {
	h.mu.Lock()
	defer h.mu.Unlock()
	set := h.subs[s.channel]
	delete(set, s)
	if len(set) > 0 {
		return
	}
	delete(h.subs, s.channel)
	delete(h.confirmed, s.channel)
	ps := h.ps
	if ps == nil {
		return
	}
	if len(h.subs) == 0 {
		// Last waiter gone: close the connection; the reader sees that ps
		// is no longer the hub's and exits. A later watch opens a new one.
		h.ps = nil
		background.Go(func() { _ = ps.Close() })
		return
	}
	channel := s.channel
	background.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		defer cancel()
		_ = ps.Unsubscribe(ctx, channel)
	})
}

// read dispatches the messages of ps until ps is closed. After a connection
// error go-redis reconnects and resubscribes on the next Receive; messages
// may have been missed meanwhile, so every waiter is woken to re-check.
func (h *hub) read(ps *redis.PubSub) {
	ctx := context.Background()
	for {
		msg, err := ps.Receive(ctx)
		h.mu.Lock()
		if h.ps != ps { // closed by unwatch
			h.mu.Unlock()
			return
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				if c, ok := h.confirmed[m.Channel]; ok {
					select {
					case <-c:
					default:
						close(c)
					}
				}
			}
		case *redis.Message:
			for s := range h.subs[m.Channel] {
				s.notify()
			}
		}
		if err != nil {
			for _, set := range h.subs {
				for s := range set {
					s.notify()
				}
			}
		}
		h.mu.Unlock()
		if err != nil {
			time.Sleep(50 * time.Millisecond) // server down: don't spin
		}
	}
}
