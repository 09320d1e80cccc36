// The Locker: New and its options, the backend state shared by the other
// files, and the bounds every request to etcd runs under.

package etcdlock

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
)

// Defaults.
const (
	// DefaultPrefix is empty: lock KEY lives under "KEY/", exactly where
	// `etcdctl lock KEY` and concurrency.NewMutex(s, "KEY") put it (for
	// keys without '/' or '%'; see the package documentation).
	DefaultPrefix = ""
	// MinTTL is the shortest lease this backend accepts. etcd leases are
	// whole seconds and the server enforces its own minimum (1.5 × the
	// election timeout, 2s by default): the server-side lease may be longer
	// than the TTL, never shorter.
	MinTTL = dlock.MinTTL
	// DefaultRequestTimeout bounds each request to etcd (the etcd client
	// otherwise waits for a connection for as long as the context allows,
	// so an unreachable cluster would look like a held lock).
	DefaultRequestTimeout = 5 * time.Second
	// maxTxnOps is etcd's default limit of operations per transaction.
	maxTxnOps = 128
)

// Option configures a Locker.
type Option func(*options)

type options struct {
	prefix         string
	requestTimeout time.Duration
}

// WithPrefix puts every lock under prefix (default DefaultPrefix): lock KEY
// then lives under "<prefix>KEY/". Use the same prefix as the etcdctl or
// concurrency.Mutex users it must exclude.
func WithPrefix(p string) Option { return func(o *options) { o.prefix = p } }

// WithRequestTimeout bounds each request to etcd (default
// DefaultRequestTimeout), within the caller's context.
func WithRequestTimeout(d time.Duration) Option { return func(o *options) { o.requestTimeout = d } }

// Locker is a lock service on an etcd cluster. It never closes the client.
type Locker struct {
	*dlock.Acquirer
	b *backend
}

var _ dlock.Locker = (*Locker)(nil)

type backend struct {
	client  *clientv3.Client
	prefix  string
	timeout time.Duration

	mu       sync.Mutex
	sessions map[int64][]*session // by requested lease TTL in seconds
	orphans  map[*entry]struct{}  // entries whose delete is pending
	spent    map[string]struct{}  // receipts no release will ask for: delete them
}

// New returns a Locker on client. A nil client gives a Locker whose every
// call fails with dlock.ErrNilClient.
func New(client *clientv3.Client, opts ...Option) *Locker {
	o := options{prefix: DefaultPrefix}
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	if o.requestTimeout <= 0 {
		o.requestTimeout = DefaultRequestTimeout
	}
	b := &backend{client: client, prefix: o.prefix, timeout: o.requestTimeout,
		sessions: map[int64][]*session{}, orphans: map[*entry]struct{}{}, spent: map[string]struct{}{}}
	return &Locker{Acquirer: dlock.NewAcquirer(b, MinTTL), b: b}
}

// errNilContext is returned by the entry points that take a context (List
// and the Guard's methods) for a nil one, like dlock's Acquire does.
var errNilContext = fmt.Errorf("%w: etcdlock: nil context", dlock.ErrInvalidOption)

// rpc bounds one request by the request timeout.
func (b *backend) rpc(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.timeout)
}

func (b *backend) check() error {
	if b.client == nil {
		return fmt.Errorf("%w: etcdlock.New was given a nil etcd client", dlock.ErrNilClient)
	}
	return nil
}
