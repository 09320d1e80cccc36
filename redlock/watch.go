package redlock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/background"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// Watch implements driver.Watcher: a release published on any node wakes
// the waiter. It returns once a majority of nodes confirmed the
// subscription (a release is published on every node, so a majority
// hears it); the rest keep subscribing in the background.
func (b *backend) Watch(ctx context.Context, key string) (driver.Subscription, error) {
	ms := &multiSub{ch: make(chan struct{}, 1), id: newWaitID()}
	nodes := make([]*redisproto.Node, len(b.nodes))
	for i, n := range b.nodes {
		nodes[i] = n.Node
	}
	// Its grants queue it on every node, including those whose
	// subscription fails: Close dequeues it from all.
	ms.w = b.waiters.Add(key, ms.id, nodes...)
	done := make(chan bool, len(b.nodes))
	for _, n := range b.nodes {
		background.Go(func() {
			s, err := n.WatchInto(ctx, key, ms.id, ms.ch)
			if err == nil && !ms.add(s) {
				s.Close() // Close came first
			}
			done <- err == nil
		})
	}
	ok := 0
	for range b.nodes {
		if <-done {
			ok++
		}
		if ok >= b.quorum {
			break
		}
	}
	if ok == 0 {
		ms.Close()
		return nil, fmt.Errorf("dlock: redlock watch %q: no node accepted the subscription", key)
	}
	return ms, nil
}

// newWaitID names a waiter: "<µs since epoch>-<random>". Every node queues
// it with the timestamp as score, so all nodes order waiters alike.
func newWaitID() string {
	return strconv.FormatInt(time.Now().UnixMicro(), 10) + "-" + dlock.NewOwner()[:8]
}

// waitScore is the queue score encoded in a wait id (0 for none).
func waitScore(id string) int64 {
	ts, _, _ := strings.Cut(id, "-")
	n, _ := strconv.ParseInt(ts, 10, 64)
	return n
}

type multiSub struct {
	id     string
	w      *redisproto.Waiter
	ch     chan struct{}
	mu     sync.Mutex
	subs   []*redisproto.Subscription
	closed bool
}

func (m *multiSub) add(s *redisproto.Subscription) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.subs = append(m.subs, s)
	return true
}

func (m *multiSub) C() <-chan struct{} { return m.ch }

// WaitID implements driver.WaitIDer.
func (m *multiSub) WaitID() string { return m.id }

// Close ends the subscriptions and dequeues the waiter on every node, in
// the background once none of its grants is in flight; it never waits on
// the network.
func (m *multiSub) Close() {
	m.mu.Lock()
	subs := m.subs
	m.subs, m.closed = nil, true
	m.mu.Unlock()
	for _, s := range subs {
		s.Close()
	}
	m.w.Leave()
}
