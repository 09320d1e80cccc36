package redlock

import (
	"context"
	"fmt"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// Defaults.
const (
	// DefaultPrefix starts every key: "dlock:{<key>}" on each node, the
	// same layout as redislock.
	DefaultPrefix = "dlock"
	// MinTTL is the shortest lease this backend accepts.
	MinTTL = dlock.MinTTL
	// DefaultNodeTimeoutFactor: each node gets TTL × this long to answer
	// (bounded by DefaultNodeTimeoutMin and DefaultNodeTimeoutMax).
	DefaultNodeTimeoutFactor = 0.05
	// DefaultNodeTimeoutMin is the smallest per-node timeout.
	DefaultNodeTimeoutMin = 50 * time.Millisecond
	// DefaultNodeTimeoutMax is the largest per-node timeout.
	DefaultNodeTimeoutMax = time.Second
	// FenceRetention is how long a node's fencing counter outlives the key's
	// last acquisition.
	FenceRetention = time.Hour
	// MetaReservedForWaiter is the metadata key reported (in a
	// *dlock.NotAcquiredError and a NodeResult) for a key nobody holds but
	// that a release reserved (for 100ms) for the waiter it woke: its value
	// is that waiter's id, and the holder is empty.
	MetaReservedForWaiter = redisproto.MetaReservedForWaiter
)

// Option configures a Locker: redlock's own options below and the core's
// (dlock.WithObserver), in one list.
type Option = dlock.LockerOption

type options struct {
	prefix         string
	nodeTimeout    time.Duration
	unsafeEviction bool
}

// WithPrefix sets the key prefix on every node (default DefaultPrefix).
func WithPrefix(p string) Option {
	return driver.Setting(func(o *options) { o.prefix = p })
}

// WithNodeTimeout fixes the time each node has to answer one request
// (default: TTL × DefaultNodeTimeoutFactor, within [DefaultNodeTimeoutMin,
// DefaultNodeTimeoutMax]). A negative duration makes every call of the
// Locker fail with an error wrapping dlock.ErrInvalidOption.
func WithNodeTimeout(d time.Duration) Option {
	return driver.Setting(func(o *options) { o.nodeTimeout = d })
}

// WithUnsafeEviction lets a Locker use nodes that may evict keys under
// memory pressure, which it otherwise refuses with an *EvictionError.
func WithUnsafeEviction() Option {
	return driver.Setting(func(o *options) { o.unsafeEviction = true })
}

// Locker is the Redlock algorithm over N independent Redis masters: a lock
// is held when a majority of them granted it with validity left. It never
// closes the clients.
type Locker struct {
	e *dlock.Engine
	b *backend
}

var (
	_ dlock.Locker        = (*Locker)(nil)
	_ dlock.Lister        = (*Locker)(nil)
	_ dlock.Breaker       = (*Locker)(nil)
	_ driver.Driver       = (*backend)(nil)
	_ driver.Watcher      = (*backend)(nil)
	_ driver.Aborter      = (*backend)(nil)
	_ driver.BatchRenewer = (*backend)(nil)
	_ driver.Breaker      = (*backend)(nil)
	_ driver.WaitIDer     = (*multiSub)(nil)
	_ driver.Settler      = (*lease)(nil)
	_ driver.LossNotifier = (*lease)(nil)
)

type node struct {
	*redisproto.Node
	idx      int // in backend.nodes
	name     string
	renewing atomic.Bool // a RefreshBatch pipeline to this node is running
	// unanswered: the node's eviction check got no answer; later attempts
	// ask it again in the background (rechecking: that check is running)
	// instead of waiting for it.
	unanswered, rechecking atomic.Bool
	// evicts is the node's refusal once its check answered that it may
	// evict keys: every later attempt returns it without asking.
	evicts atomic.Pointer[EvictionError]
}

// backend is the driver: the nodes and the quorum.
type backend struct {
	waiters     redisproto.Waiters
	nodes       []*node
	quorum      int
	nodeTimeout time.Duration // 0: derived from the TTL
	// unsafeEviction: WithUnsafeEviction (else Try refuses nodes that
	// may evict keys).
	unsafeEviction bool
	tokens         proposer
	// commitAlways: attempts propose no token, so every token goes
	// through the commit round (set by tests of that round).
	commitAlways bool
	// commitRounds counts the phase-two rounds run (read by tests).
	commitRounds atomic.Uint64
	// maxLead is the grants' Proposal.MaxLead (0: the default; set by
	// tests).
	maxLead time.Duration
}

// New returns a Locker over clients, one per independent master (use an
// odd number, 3 or 5), configured by redlock's options and the core's
// (dlock.WithObserver). Nil clients, an empty slice, a client listed twice
// or an option out of range give a Locker whose every call fails with an
// error wrapping dlock.ErrNilClient or dlock.ErrInvalidOption.
func New(clients []redis.UniversalClient, opts ...Option) *Locker {
	o := options{prefix: DefaultPrefix}
	driver.Apply(&o, opts)
	if o.prefix == "" {
		o.prefix = DefaultPrefix
	}
	b := &backend{quorum: len(clients)/2 + 1, nodeTimeout: o.nodeTimeout, unsafeEviction: o.unsafeEviction}
	if err := b.addNodes(clients, o); err != nil {
		return &Locker{e: dlock.NewEngine(driver.Failed(err)), b: b}
	}
	return &Locker{e: dlock.NewEngine(b, opts...), b: b}
}

// addNodes checks the options and the clients and makes a node of each
// client.
func (b *backend) addNodes(clients []redis.UniversalClient, o options) error {
	if o.nodeTimeout < 0 {
		return fmt.Errorf("%w: redlock node timeout %v is negative", dlock.ErrInvalidOption, o.nodeTimeout)
	}
	if len(clients) == 0 {
		return fmt.Errorf("%w: redlock.New: no clients", dlock.ErrNilClient)
	}
	seen := map[redis.UniversalClient]bool{}
	for i, c := range clients {
		switch {
		case redisproto.IsNil(c):
			return fmt.Errorf("%w: redlock.New: client %d is nil", dlock.ErrNilClient, i)
		case !reflect.ValueOf(c).Comparable():
			// Not a map key (a wrapper with a slice field, say): it
			// cannot be told apart from the others, and indexing seen
			// with it would panic.
		case seen[c]:
			return fmt.Errorf("%w: redlock.New: client %d is listed twice; nodes must be independent", dlock.ErrInvalidOption, i)
		default:
			seen[c] = true
		}
		b.nodes = append(b.nodes, &node{Node: redisproto.NewNode(c, o.prefix), idx: len(b.nodes), name: nodeName(c, i)})
	}
	return nil
}

// Spec implements driver.Driver: exclusive locks only.
func (b *backend) Spec() driver.Spec {
	return driver.Spec{Name: "redlock", MinTTL: MinTTL}
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

func nodeName(c redis.UniversalClient, i int) string {
	if rc, ok := c.(*redis.Client); ok {
		return rc.Options().Addr
	}
	return fmt.Sprintf("node%d", i)
}

// Quorum is the number of nodes that must grant a lock (0 for the zero
// Locker).
func (l *Locker) Quorum() int {
	if l == nil || l.b == nil {
		return 0
	}
	return l.b.quorum
}

func (b *backend) timeout(ttl time.Duration) time.Duration {
	if b.nodeTimeout > 0 {
		return b.nodeTimeout
	}
	d := time.Duration(float64(ttl) * DefaultNodeTimeoutFactor)
	return min(max(d, DefaultNodeTimeoutMin), DefaultNodeTimeoutMax)
}
