package redisx

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// confirmTimeout bounds how long Watch waits for Redis to confirm a
// SUBSCRIBE before the waiter proceeds on polling alone.
const confirmTimeout = 2 * time.Second

// hub multiplexes the release channels of all waiters of one Locker over a
// single pub/sub connection. The connection and its reader goroutine exist
// only while someone waits: the last subscription's Close tears them down.
type hub struct {
	client redis.UniversalClient

	mu   sync.Mutex
	ps   *redis.PubSub
	done chan struct{} // closed when the current reader exits
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

func (s *Subscription) C() <-chan struct{} { return s.ch }
func (s *Subscription) Close()             { s.once.Do(func() { s.h.unwatch(s) }) }

func (s *Subscription) notify() {
	select {
	case s.ch <- struct{}{}:
	default:
	}
}

// watch subscribes to channel and waits (bounded) for the confirmation, so
// a release published after watch returns is heard.
func (h *hub) watch(ctx context.Context, channel string, ch chan struct{}) (*Subscription, error) {
	s := &Subscription{h: h, channel: channel, ch: ch}
	h.mu.Lock()
	if h.ps == nil {
		h.ps = h.client.Subscribe(context.WithoutCancel(ctx))
		h.done = make(chan struct{})
		go h.read(h.ps, h.done)
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
	if first {
		if err := ps.Subscribe(ctx, channel); err != nil {
			s.Close()
			return nil, err
		}
	}
	t := time.NewTimer(confirmTimeout)
	defer t.Stop()
	select {
	case <-confirmed:
	case <-t.C: // proceed; the polling fallback covers a missed message
	case <-ctx.Done():
		s.Close()
		return nil, ctx.Err()
	}
	return s, nil
}

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
	if len(h.subs) == 0 && h.ps != nil {
		// Last waiter gone: close the connection; the reader exits.
		_ = h.ps.Close()
		h.ps = nil
		done := h.done
		h.mu.Unlock()
		<-done
		h.mu.Lock()
		return
	}
	if h.ps != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = h.ps.Unsubscribe(ctx, s.channel)
		cancel()
	}
}

// read dispatches messages until ps is closed. After a connection error
// go-redis reconnects and resubscribes on the next Receive; messages may
// have been missed meanwhile, so every waiter is woken to re-check.
func (h *hub) read(ps *redis.PubSub, done chan struct{}) {
	defer close(done)
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
