package redislock

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// Defaults.
const (
	// DefaultPrefix starts every key dlock writes: "dlock:{<key>}".
	DefaultPrefix = "dlock"
	// MinTTL is the shortest lease this backend accepts.
	MinTTL = dlock.MinTTL
	// FenceRetention is how long a released key keeps its last fencing
	// token (the "|<token>" marker; see docs/redislock.md).
	FenceRetention = redisproto.MarkerRetention
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
// semaphores (dlock.WithLimit); see docs/redislock.md.
type Locker struct {
	e *dlock.Engine
	b *backend // nil when New failed
}

var (
	_ dlock.Locker = (*Locker)(nil)
	_ dlock.Lister = (*Locker)(nil)
)

// New returns a Locker on client, configured by opts (WithPrefix,
// WithReplicaAcks, WithProtocol, WithUnsafeEviction, dlock.WithObserver). A nil client gives a Locker whose
// every call fails with an error wrapping dlock.ErrNilClient, and invalid
// options (see WithReplicaAcks) one whose every call fails with an error
// wrapping dlock.ErrInvalidOption.
func New(client redis.UniversalClient, opts ...Option) *Locker {
	if redisproto.IsNil(client) {
		return &Locker{e: dlock.NewEngine(driver.Failed(fmt.Errorf("%w: redislock.New was given a nil redis client", dlock.ErrNilClient)))}
	}
	cfg := newConfig(opts)
	if err := cfg.validate(client, "redislock.New"); err != nil {
		return &Locker{e: dlock.NewEngine(driver.Failed(err))}
	}
	b := &backend{node: redisproto.NewNode(client, cfg.prefix), unsafeEviction: cfg.unsafeEviction}
	b.proto = protocol{forced: cfg.protocol, learned: learnedFor(client), node: b.node}
	b.breaks.node = b.node
	b.node.Acks, b.node.AckTimeout = cfg.acks, cfg.ackTimeout
	return &Locker{e: dlock.NewEngine(b, opts...), b: b}
}

// Acquire implements dlock.Locker.
func (l *Locker) Acquire(ctx context.Context, key string, opts ...dlock.Option) (*dlock.Lock, error) {
	return l.engine().Acquire(ctx, key, opts...)
}

// TryAcquire implements dlock.Locker.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...dlock.Option) (*dlock.Lock, error) {
	return l.engine().TryAcquire(ctx, key, opts...)
}

// engine is l's Engine, nil for a nil *Locker: every call of a nil *Locker
// then fails with an error wrapping dlock.ErrNilClient instead of panicking.
func (l *Locker) engine() *dlock.Engine {
	if l == nil {
		return nil
	}
	return l.e
}

// LockKey is the Redis key holding key's lease ("" for a nil Locker, or
// one built on a nil client or with invalid options).
func (l *Locker) LockKey(key string) string {
	if l == nil || l.b == nil {
		return ""
	}
	return l.b.node.LockKey(key)
}

// Option configures a Locker or a Guard: redislock's own options
// (WithPrefix, WithReplicaAcks) and the core's (dlock.WithObserver), in
// one list.
type Option = dlock.LockerOption

// config holds redislock's own settings.
type config struct {
	prefix     string
	acks       int
	ackTimeout time.Duration
	// unsafeEviction: WithUnsafeEviction.
	unsafeEviction bool
	// protocol: WithProtocol.
	protocol Protocol
}

// WithPrefix sets the key prefix (default DefaultPrefix; an empty prefix
// means the default). Lockers must use the same prefix to exclude each
// other, and Guards to share their fences.
func WithPrefix(p string) Option {
	return driver.Setting(func(c *config) { c.prefix = p })
}

// WithReplicaAcks makes each acquisition and each renewal count only once
// at least n replicas acknowledged it: the script is followed by WAIT n
// timeout on the connection that ran it (one pipeline, one round trip).
// A Locker rolls back an acquisition acknowledged by fewer (an owner-checked
// release) and fails the attempt with a *ReplicationError (wrapping
// dlock.ErrTransient, so a blocking Acquire tries again, or, when fewer
// than n replicas are connected to the primary, dlock.ErrUnavailable,
// which a blocking Acquire returns: no attempt could succeed); a renewal
// acknowledged by fewer is not counted (the lock keeps its previous local
// deadline, and Lost() fires at it unless a later renewal is
// acknowledged). A Guard's writes (Put, IncrBy, Eval) fail with a
// *ReplicationError once applied but acknowledged by fewer. Releases and
// reads wait for nobody. See "Replica acknowledgement" in
// docs/redislock.md for what acknowledgement does and does not cover.
//
// n is 0 (off, the default) to MaxReplicaAcks; timeout at most
// MaxAckTimeout, and <= 0 means DefaultAckTimeout. The client must be a
// *redis.Client (standalone or Sentinel: redis.NewClient,
// redis.NewFailoverClient) whose ReadTimeout (default 3s) is above
// timeout, so that the WAIT's reply is read. Otherwise every call of the
// Locker or Guard fails with an error wrapping dlock.ErrInvalidOption.
// Each attempt and renewal takes up to timeout longer when replicas are
// slow or gone: keep timeout well below the locks' TTL.
func WithReplicaAcks(n int, timeout time.Duration) Option {
	return driver.Setting(func(c *config) { c.acks, c.ackTimeout = n, timeout })
}

// WithUnsafeEviction lets a Locker or Guard use a server that may evict
// keys under memory pressure (maxmemory set, maxmemory-policy not
// noeviction), which they otherwise refuse with an *EvictionError. An
// evicted lock key is free for the next caller while its holder keeps
// running until its next renewal finds the key gone (up to a third of the
// TTL, plus the renewal's round trip); an evicted Guard fence record
// admits fences it had refused.
func WithUnsafeEviction() Option {
	return driver.Setting(func(c *config) { c.unsafeEviction = true })
}

// newConfig applies opts to the defaults.
func newConfig(opts []Option) config {
	c := config{prefix: DefaultPrefix}
	driver.Apply(&c, opts)
	if c.prefix == "" {
		c.prefix = DefaultPrefix
	}
	if c.ackTimeout <= 0 {
		c.ackTimeout = DefaultAckTimeout
	}
	return c
}

// errAcksClient explains WithReplicaAcks on a client that is not a
// *redis.Client.
const errAcksClient = "replica acknowledgement needs a standalone or Sentinel client (redis.Client)"

// validate checks the options against client (not nil): an error
// wrapping dlock.ErrInvalidOption, or nil.
func (c config) validate(client redis.UniversalClient, fn string) error {
	switch {
	case c.acks < 0 || c.acks > MaxReplicaAcks:
		return fmt.Errorf("%w: %s: WithReplicaAcks(%d, ...): the replica count must be 0 (off) to %d", dlock.ErrInvalidOption, fn, c.acks, MaxReplicaAcks)
	case c.ackTimeout > MaxAckTimeout:
		return fmt.Errorf("%w: %s: WithReplicaAcks(%d, %s): the timeout must be at most %s", dlock.ErrInvalidOption, fn, c.acks, c.ackTimeout, MaxAckTimeout)
	case c.protocol < ProtocolAuto || c.protocol > ProtocolTair:
		return fmt.Errorf("%w: %s: WithProtocol(%v): want ProtocolAuto, ProtocolScripts or ProtocolTair", dlock.ErrInvalidOption, fn, c.protocol)
	case c.protocol == ProtocolTair && c.acks > 0:
		return fmt.Errorf("%w: %s: WithReplicaAcks(%d, ...) with ProtocolTair: replica acknowledgement needs the scripts", dlock.ErrInvalidOption, fn, c.acks)
	case c.acks == 0:
		return nil
	}
	rc, ok := client.(*redis.Client)
	if !ok {
		return fmt.Errorf("%w: %s: WithReplicaAcks(%d, ...) on a %T: %s", dlock.ErrInvalidOption, fn, c.acks, client, errAcksClient)
	}
	if rt := rc.Options().ReadTimeout; rt > 0 && c.ackTimeout >= rt {
		return fmt.Errorf("%w: %s: WithReplicaAcks(%d, %s): the timeout must be below the client's ReadTimeout (%s), or WAIT's reply is never read", dlock.ErrInvalidOption, fn, c.acks, c.ackTimeout, rt)
	}
	return nil
}

// backend is the driver the Locker's Engine runs: one Redis deployment
// speaking the protocol of package redisproto.
type backend struct {
	node    *redisproto.Node
	waiters redisproto.Waiters
	idle    idleWaiters // channels of granted waits, for the next (Ready)
	// breaks and breakChecks: held locks listen for break notices, and
	// read their keys on one.
	breaks      breakWatch
	breakChecks breakChecks
	// unsafeEviction: WithUnsafeEviction (else Try refuses a server that
	// may evict keys).
	unsafeEviction bool
	// proto: scripts, or the Lua-free protocol (see protocol.go).
	proto protocol
}

var (
	_ driver.Driver       = (*backend)(nil)
	_ driver.Aborter      = (*backend)(nil)
	_ driver.Leaver       = (*backend)(nil)
	_ driver.Watcher      = (*backend)(nil)
	_ driver.ReadyWatcher = (*backend)(nil)
	_ driver.BatchRenewer = (*backend)(nil)
	_ driver.WaitIDer     = (*subscription)(nil)
)

// Spec implements driver.Driver: exclusive, shared and limited locks.
func (b *backend) Spec() driver.Spec {
	return driver.Spec{Name: "redis", MinTTL: MinTTL, Shared: true, Limited: true}
}
