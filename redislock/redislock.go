package redislock

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// Defaults.
const (
	// DefaultPrefix starts every key dlock writes: "dlock:{<key>}".
	DefaultPrefix = "dlock"
	// MinTTL is the shortest lease this backend accepts.
	MinTTL = dlock.MinTTL
	// FenceRetention is how long a released key keeps its last fencing
	// token (the "|<token>" marker; see the package documentation).
	FenceRetention = time.Hour
	// MetaReservedForWaiter is the metadata key of the holder reported by
	// a *dlock.NotAcquiredError for a key nobody holds but that a release
	// reserved (for 100ms) for the waiter it woke: its value is that
	// waiter's id, the Holder has no owner and its TTL is the reservation
	// left.
	MetaReservedForWaiter = redisproto.MetaReservedForWaiter
)

// Locker is a lock service on one Redis deployment (standalone, Sentinel
// or Cluster through a go-redis UniversalClient). It never closes the
// client. All locks taken through one Locker are renewed together by one
// watchdog, one pipelined round trip per tick. It offers exclusive locks,
// read-write locks with writer preference (dlock.WithShared) and
// semaphores (dlock.WithLimit); see the package documentation.
type Locker struct {
	e *dlock.Engine
	b *backend // nil when New failed
}

var (
	_ dlock.Locker = (*Locker)(nil)
	_ dlock.Lister = (*Locker)(nil)
)

// New returns a Locker on client, configured by opts (WithPrefix,
// WithReplicaAcks, dlock.WithObserver). A nil client gives a Locker whose
// every call fails with an error wrapping dlock.ErrNilClient, and invalid
// options (see WithReplicaAcks) one whose every call fails with an error
// wrapping dlock.ErrInvalidOption.
func New(client redis.UniversalClient, opts ...Option) *Locker {
	if redisproto.IsNil(client) {
		return &Locker{e: dlock.FailedEngine(fmt.Errorf("%w: redislock.New was given a nil redis client", dlock.ErrNilClient))}
	}
	cfg := newConfig(opts)
	if err := cfg.validate(client, "redislock.New"); err != nil {
		return &Locker{e: dlock.FailedEngine(err)}
	}
	b := &backend{node: redisproto.NewNode(client, cfg.prefix), unsafeEviction: cfg.unsafeEviction}
	b.node.Acks, b.node.AckTimeout = cfg.acks, cfg.ackTimeout
	return &Locker{e: dlock.NewEngine(b, opts...), b: b}
}

// Acquire implements dlock.Locker.
func (l *Locker) Acquire(ctx context.Context, key string, opts ...dlock.Option) (*dlock.Lock, error) {
	return l.e.Acquire(ctx, key, opts...)
}

// TryAcquire implements dlock.Locker.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...dlock.Option) (*dlock.Lock, error) {
	return l.e.TryAcquire(ctx, key, opts...)
}

// LockKey is the Redis key holding key's lease ("" for a Locker built on
// a nil client or with invalid options).
func (l *Locker) LockKey(key string) string {
	if l.b == nil {
		return ""
	}
	return l.b.node.LockKey(key)
}
