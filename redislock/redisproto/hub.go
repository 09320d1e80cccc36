package redisproto

import (
	"context"
	"errors"
	"slices"
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

// errUnwatched answers a SUBSCRIBE that was dropped before it was sent
// because its channel was unwatched meanwhile.
var errUnwatched = errors.New("redisproto: subscription closed before it was sent")

// hub multiplexes the release channels of all waiters of one Locker over a
// single pub/sub connection. The connection, its reader goroutine and its
// worker goroutine exist only while someone waits: the last
// subscription's Close tears them down.
//
// Nothing a caller waits for blocks on the connection. go-redis serialises
// the methods of a PubSub on one mutex, which a (re)connection holds while
// it dials and handshakes: on a stalled link, SUBSCRIBE, UNSUBSCRIBE and
// Close can each wait for the client's read timeout and retries. So watch
// waits for a SUBSCRIBE at most confirmTimeout (or its context), and Close
// only updates the hub's maps and queues the UNSUBSCRIBE (or the closing
// of the connection). hub.mu is never held across a call into the PubSub.
//
// The requests for one connection are sent in the order they were queued,
// by one worker goroutine at a time (see hubConn): a SUBSCRIBE and the
// UNSUBSCRIBE that undoes it, sent from goroutines of their own, could
// reach the PubSub in the wrong order and leave the channel subscribed
// for as long as the connection lives.
type hub struct {
	client redis.UniversalClient
	// lasting: the hub's subscriptions last as long as locks are held
	// (break notices), not as long as a bounded wait: its reader is not
	// counted as background work (package background), and ends when the
	// client is closed.
	lasting bool

	mu   sync.Mutex
	conn *hubConn // nil while nobody waits
	// channel -> live subscriptions (a slice: a channel has one listener
	// or a few, and a Locker holding many locks listens on one channel
	// per lock)
	subs map[string][]*Subscription
	// channel -> closed when Redis confirms the SUBSCRIBE; made by watch
	// only (listen's subscriptions are told by a call instead)
	confirmed map[string]chan struct{}
}

// hubConn is one pub/sub connection of a hub and the queue of requests
// for it. A worker goroutine, started when the queue becomes non-empty and
// ending when it is empty, sends the requests in queue order, so that
// Redis's subscriptions follow the order of watch and Close. A SUBSCRIBE
// still queued when its channel is unwatched is dropped together with the
// UNSUBSCRIBE, and closing the connection drops every request still
// queued: on a stalled link the queue holds at most one request per live
// channel plus the UNSUBSCRIBEs of channels already subscribed.
type hubConn struct {
	ps *redis.PubSub
	// under hub.mu:
	ops     []hubOp
	working bool // a worker goroutine is running
}

type opKind int

const (
	opSubscribe opKind = iota
	opUnsubscribe
	opClose
)

type hubOp struct {
	kind    opKind
	channel string     // a channel, or a pattern
	pattern bool       // PSUBSCRIBE, PUNSUBSCRIBE
	done    chan error // opSubscribe by watch: the result (buffered)
}

func newHub(c redis.UniversalClient) *hub {
	return &hub{client: c, subs: map[string][]*Subscription{}, confirmed: map[string]chan struct{}{}}
}

// Subscription is a live interest in a release channel.
type Subscription struct {
	h       *hub
	channel string
	ch      chan struct{} // watch's: notices are sent here
	fnc     func(string)  // listenPattern's: called with the channel ("" when not a message)
	pattern bool          // channel is a pattern (PSUBSCRIBE)
	once    sync.Once
}

// key is s's key in hub.subs: its channel, or its pattern after a NUL
// (dlock's channel names never start with one).
func (s *Subscription) key() string {
	if s.pattern {
		return "\x00" + s.channel
	}
	return s.channel
}

// C receives (without blocking the sender) when the channel publishes.
func (s *Subscription) C() <-chan struct{} { return s.ch }

// Confirmed reports whether the subscription is live and Redis confirmed
// its channel's SUBSCRIBE. (After a lost connection go-redis subscribes
// again when it reconnects; the hub wakes every listener then, and their
// polling covers what was published meanwhile.)
func (s *Subscription) Confirmed() bool {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	if !slices.Contains(s.h.subs[s.key()], s) {
		return false
	}
	select {
	case <-s.h.confirmed[s.channel]:
		return true
	default:
		return false
	}
}

// Close ends the subscription. It never waits on the network.
func (s *Subscription) Close() { s.once.Do(func() { s.h.unwatch(s) }) }

func (s *Subscription) notify() {
	if s.fnc != nil {
		s.fnc("")
		return
	}
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
	first := h.addLocked(s)
	confirmed := h.confirmed[channel]
	if confirmed == nil {
		confirmed = make(chan struct{})
		h.confirmed[channel] = confirmed
	}
	var subscribed chan error
	if first {
		subscribed = make(chan error, 1)
		h.queueLocked(h.conn, hubOp{kind: opSubscribe, channel: channel, done: subscribed})
	}
	h.mu.Unlock()
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

// listenPattern subscribes fn to a pattern (PSUBSCRIBE) without waiting
// for anything: fn is called on the hub's reader goroutine, with the hub
// locked (it must not block, nor call into the hub), with the channel of
// each message matching the pattern, and with "" once Redis confirms the
// PSUBSCRIBE (a message published before may have been missed) and when
// the connection failed.
func (h *hub) listenPattern(pattern string, fn func(channel string)) *Subscription {
	s := &Subscription{h: h, channel: pattern, fnc: fn, pattern: true}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.addLocked(s) {
		h.queueLocked(h.conn, hubOp{kind: opSubscribe, channel: pattern, pattern: true})
	}
	return s
}

// addLocked registers s, opening the hub's connection if none is open,
// and reports whether s is its channel's first listener (its SUBSCRIBE
// is to be sent). h.mu held.
func (h *hub) addLocked(s *Subscription) (first bool) {
	if h.conn == nil {
		// No connection is made before the first request or Receive.
		c := &hubConn{ps: h.client.Subscribe(context.Background())}
		h.conn = c
		if h.lasting {
			go h.read(c)
		} else {
			background.Go(func() { h.read(c) })
		}
	}
	set := h.subs[s.key()]
	h.subs[s.key()] = append(set, s)
	return len(set) == 0
}

// unwatch removes s. When s was the channel's last listener the channel's
// UNSUBSCRIBE is queued, and when it was the hub's last the connection's
// closing: unwatch returns at once even on a stalled link.
func (h *hub) unwatch(s *Subscription) {
	h.mu.Lock()
	defer h.mu.Unlock()
	set := h.subs[s.key()]
	i := slices.Index(set, s)
	if i < 0 {
		return
	}
	if set = slices.Delete(set, i, i+1); len(set) > 0 {
		h.subs[s.key()] = set
		return
	}
	delete(h.subs, s.key())
	if !s.pattern {
		delete(h.confirmed, s.channel)
	}
	c := h.conn
	if c == nil {
		return
	}
	if len(h.subs) == 0 {
		// Last waiter gone: close the connection; the reader sees that c
		// is no longer the hub's and exits. A later watch opens a new one.
		h.conn = nil
		h.queueLocked(c, hubOp{kind: opClose})
		return
	}
	h.queueLocked(c, hubOp{kind: opUnsubscribe, channel: s.channel, pattern: s.pattern})
}

// queueLocked appends op to c's queue and starts its worker if none runs.
// An UNSUBSCRIBE cancels its channel's SUBSCRIBE if that is still queued;
// a close drops everything still queued. h.mu held.
func (h *hub) queueLocked(c *hubConn, op hubOp) {
	switch op.kind {
	case opUnsubscribe:
		for i, o := range c.ops {
			if o.kind == opSubscribe && o.channel == op.channel && o.pattern == op.pattern {
				if o.done != nil {
					o.done <- errUnwatched
				}
				c.ops = slices.Delete(c.ops, i, i+1)
				return
			}
		}
	case opClose:
		for _, o := range c.ops {
			if o.done != nil {
				o.done <- errUnwatched
			}
		}
		c.ops = c.ops[:0]
	}
	c.ops = append(c.ops, op)
	if !c.working {
		c.working = true
		background.Go(func() { h.work(c) })
	}
}

// work sends c's queued requests in order until the queue is empty;
// consecutive requests of one kind go as one command.
func (h *hub) work(c *hubConn) {
	for {
		h.mu.Lock()
		ops := c.ops
		c.ops = nil
		if len(ops) == 0 {
			c.working = false
			h.mu.Unlock()
			return
		}
		h.mu.Unlock()
		for i := 0; i < len(ops); {
			j := i + 1
			for j < len(ops) && ops[j].kind == ops[i].kind && ops[j].pattern == ops[i].pattern && ops[i].kind != opClose {
				j++
			}
			if ops[i].kind == opClose {
				_ = c.ps.Close()
				// Nothing is queued after a close: the hub forgot c.
				i = j
				continue
			}
			channels := make([]string, 0, j-i)
			for _, o := range ops[i:j] {
				channels = append(channels, o.channel)
			}
			ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
			var err error
			switch {
			case ops[i].kind == opSubscribe && ops[i].pattern:
				err = c.ps.PSubscribe(ctx, channels...)
			case ops[i].kind == opSubscribe:
				err = c.ps.Subscribe(ctx, channels...)
			case ops[i].pattern:
				err = c.ps.PUnsubscribe(ctx, channels...)
			default:
				err = c.ps.Unsubscribe(ctx, channels...)
			}
			cancel()
			for _, o := range ops[i:j] {
				if o.done != nil {
					o.done <- err
				}
			}
			i = j
		}
	}
}

// read dispatches the messages of c until c is closed. After a connection
// error go-redis reconnects and resubscribes on the next Receive; messages
// may have been missed meanwhile, so every waiter is woken to re-check.
func (h *hub) read(c *hubConn) {
	ctx := context.Background()
	for {
		msg, err := c.ps.Receive(ctx)
		h.mu.Lock()
		if h.conn != c { // closed by unwatch
			h.mu.Unlock()
			return
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				if ch, ok := h.confirmed[m.Channel]; ok {
					select {
					case <-ch:
					default:
						close(ch)
					}
				}
			}
			if m.Kind == "psubscribe" {
				for _, s := range h.subs["\x00"+m.Channel] {
					s.fnc("")
				}
			}
		case *redis.Message:
			if m.Pattern != "" {
				for _, s := range h.subs["\x00"+m.Pattern] {
					s.fnc(m.Channel)
				}
				break
			}
			for _, s := range h.subs[m.Channel] {
				s.notify()
			}
		}
		if err != nil {
			for _, set := range h.subs {
				for _, s := range set {
					s.notify()
				}
			}
		}
		if err != nil && h.lasting && errors.Is(err, redis.ErrClosed) {
			// The client is closed: nothing more will arrive. The
			// listeners, told above, find the client closed and leave.
			h.conn = nil
			h.mu.Unlock()
			return
		}
		h.mu.Unlock()
		if err != nil {
			time.Sleep(50 * time.Millisecond) // server down: don't spin
		}
	}
}

// Watch subscribes waiter id to its turn on key: the channel a release
// publishes on when it picks id from the waiter queue.
func (n *Node) Watch(ctx context.Context, key, id string) (*Subscription, error) {
	return n.hub.watch(ctx, n.WaiterChannel(key, id), make(chan struct{}, 1))
}

// WatchInto is Watch delivering into ch (buffered, sent without
// blocking), so one waiter can listen on several nodes without a goroutine
// each.
func (n *Node) WatchInto(ctx context.Context, key, id string, ch chan struct{}) (*Subscription, error) {
	return n.hub.watch(ctx, n.WaiterChannel(key, id), ch)
}
