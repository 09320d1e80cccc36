// Wake-ups: one LISTEN connection per Locker, while some Acquire waits,
// dispatching release notifications to the waiters of the released key.

package pglock

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/background"
)

// listener holds the LISTEN connection of a Locker while it has
// subscribers, and closes it when the last one leaves. A notification
// lost (the connection broke, or a transaction pooler sits between: NOTIFY
// does not cross one) delays a waiter by one poll step at most: the engine
// keeps polling with its backoff while it waits.
type listener struct {
	b *backend

	mu     sync.Mutex
	subs   map[string]map[*sub]struct{}
	n      int
	cancel context.CancelFunc // of the running LISTEN loop; nil if none
}

func newListener(b *backend) *listener {
	return &listener{b: b, subs: map[string]map[*sub]struct{}{}}
}

// sub is one waiter's subscription.
type sub struct {
	l    *listener
	key  string
	c    chan struct{}
	once sync.Once
}

func (s *sub) C() <-chan struct{} { return s.c }

func (s *sub) Close() {
	s.once.Do(func() { s.l.remove(s) })
}

// Watch implements driver.Watcher.
func (b *backend) Watch(ctx context.Context, key string) (driver.Subscription, error) {
	if b.l == nil {
		return nil, errNoListen
	}
	return b.l.add(key), nil
}

var errNoListen = errors.New("dlock: pglock: WithoutListen: waiters poll")

func (l *listener) add(key string) *sub {
	s := &sub{l: l, key: key, c: make(chan struct{}, 1)}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.subs[key] == nil {
		l.subs[key] = map[*sub]struct{}{}
	}
	l.subs[key][s] = struct{}{}
	l.n++
	if l.cancel == nil {
		ctx, cancel := context.WithCancel(context.Background())
		l.cancel = cancel
		background.Go(func() { l.run(ctx) })
	}
	return s
}

func (l *listener) remove(s *sub) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if m := l.subs[s.key]; m != nil {
		if _, ok := m[s]; ok {
			delete(m, s)
			l.n--
		}
		if len(m) == 0 {
			delete(l.subs, s.key)
		}
	}
	if l.n == 0 && l.cancel != nil {
		l.cancel()
		l.cancel = nil
	}
}

// notify wakes the waiters of key.
func (l *listener) notify(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for s := range l.subs[key] {
		select {
		case s.c <- struct{}{}:
		default:
		}
	}
}

// wakeAll wakes every waiter (the connection was re-established: a
// release may have been missed meanwhile).
func (l *listener) wakeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.subs {
		for s := range m {
			select {
			case s.c <- struct{}{}:
			default:
			}
		}
	}
}

// run holds a LISTEN connection until ctx ends, reconnecting after a
// pause when it breaks.
func (l *listener) run(ctx context.Context) {
	for ctx.Err() == nil {
		l.listenOnce(ctx)
		t := time.NewTimer(time.Second)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
}

func (l *listener) listenOnce(ctx context.Context) {
	b := l.b
	actx, cancel := b.rpc(ctx)
	conn, err := b.pool.Acquire(actx)
	cancel()
	if err != nil {
		return
	}
	// The connection carries session state (LISTEN): never hand it back
	// to the pool.
	pc := conn.Hijack()
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		pc.Close(cctx)
		cancel()
	}()
	lctx, cancel := b.rpc(ctx)
	_, err = pc.Exec(lctx, "LISTEN "+pgx.Identifier{b.n.channel}.Sanitize())
	cancel()
	if err != nil {
		return
	}
	l.wakeAll()
	for {
		n, err := pc.WaitForNotification(ctx)
		if err != nil {
			return
		}
		l.notify(n.Payload)
	}
}
