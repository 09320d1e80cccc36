package redlock

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
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

// Option configures a Locker.
type Option func(*options)

type options struct {
	prefix      string
	nodeTimeout time.Duration
}

// WithPrefix sets the key prefix on every node (default DefaultPrefix).
func WithPrefix(p string) Option { return func(o *options) { o.prefix = p } }

// WithNodeTimeout fixes the time each node has to answer one request
// (default: TTL × DefaultNodeTimeoutFactor, within [DefaultNodeTimeoutMin,
// DefaultNodeTimeoutMax]).
func WithNodeTimeout(d time.Duration) Option { return func(o *options) { o.nodeTimeout = d } }

// Locker is the Redlock algorithm over N independent Redis masters: a lock
// is held when a majority of them granted it with validity left. It never
// closes the clients.
type Locker struct {
	*dlock.Acquirer
	b *backend
}

var _ dlock.Locker = (*Locker)(nil)

type node struct {
	*redisproto.Node
	name     string
	renewing atomic.Bool // a RefreshBatch pipeline to this node is running
}

type backend struct {
	waiters     redisproto.Waiters
	nodes       []*node
	quorum      int
	nodeTimeout time.Duration // 0: derived from the TTL
	err         error         // construction error, reported by every call
}

// New returns a Locker over clients, one per independent master (use an
// odd number, 3 or 5). Nil clients, an empty slice or a client listed twice
// give a Locker whose every call fails with an error wrapping
// dlock.ErrNilClient or dlock.ErrInvalidOption.
func New(clients []redis.UniversalClient, opts ...Option) *Locker {
	o := options{prefix: DefaultPrefix}
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	if o.prefix == "" {
		o.prefix = DefaultPrefix
	}
	b := &backend{quorum: len(clients)/2 + 1, nodeTimeout: o.nodeTimeout}
	seen := map[redis.UniversalClient]bool{}
	for i, c := range clients {
		switch {
		case redisproto.IsNil(c):
			b.err = fmt.Errorf("%w: redlock.New: client %d is nil", dlock.ErrNilClient, i)
		case seen[c]:
			b.err = fmt.Errorf("%w: redlock.New: client %d is listed twice; nodes must be independent", dlock.ErrInvalidOption, i)
		}
		if b.err != nil {
			break
		}
		seen[c] = true
		b.nodes = append(b.nodes, &node{Node: redisproto.NewNode(c, o.prefix), name: nodeName(c, i)})
	}
	if len(clients) == 0 {
		b.err = fmt.Errorf("%w: redlock.New: no clients", dlock.ErrNilClient)
	}
	if o.nodeTimeout < 0 {
		b.err = fmt.Errorf("%w: redlock node timeout %v is negative", dlock.ErrInvalidOption, o.nodeTimeout)
	}
	return &Locker{Acquirer: dlock.NewAcquirer(b, MinTTL), b: b}
}

func nodeName(c redis.UniversalClient, i int) string {
	if rc, ok := c.(*redis.Client); ok {
		return rc.Options().Addr
	}
	return fmt.Sprintf("node%d", i)
}

// Quorum is the number of nodes that must grant a lock.
func (l *Locker) Quorum() int { return l.b.quorum }

func (b *backend) timeout(ttl time.Duration) time.Duration {
	if b.nodeTimeout > 0 {
		return b.nodeTimeout
	}
	d := time.Duration(float64(ttl) * DefaultNodeTimeoutFactor)
	return min(max(d, DefaultNodeTimeoutMin), DefaultNodeTimeoutMax)
}
