package etcdlock_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/etcdlock/etcdtest"
	"github.com/dlock-go/dlock/internal/testserver"
)

// proxied returns a one-member cluster, a Locker that reaches it through
// a fault proxy, and that proxy.
func proxied(t *testing.T) (*etcdtest.Cluster, *etcdlock.Locker, *testserver.Proxy) {
	t.Helper()
	c := etcdtest.Start(t, 1)
	u, err := url.Parse(c.Members[0].ClientURL)
	if err != nil {
		t.Fatal(err)
	}
	p := testserver.StartProxy(t, u.Host)
	l := etcdlock.New(newClient(t, []string{"http://" + p.Addr()}))
	t.Cleanup(p.Heal)
	return c, l, p
}

// lossyLocker is a Locker on a one-member cluster whose client loses the
// reply to the requests r is armed for.
func lossyLocker(t *testing.T) (*etcdtest.Cluster, *etcdlock.Locker, *replyLoser) {
	t.Helper()
	c := etcdtest.Start(t, 1)
	r := &replyLoser{}
	return c, etcdlock.New(lossyClient(t, c.Endpoints(), r)), r
}

func ctxFor(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// replyLoser loses the reply to one chosen request of an etcd client: the
// request reaches the real server and takes effect there, and the client
// gets an error instead of the reply, as if the connection had failed
// just after the request was sent. Unlike a fault proxy arming "the next
// reply" on a connection that several streams share (watches, lease
// keep-alives, HTTP/2 pings), it picks the request by what it asks, so
// the intended request loses its reply every run.
type replyLoser struct {
	mu    sync.Mutex
	match func(method string, req any) bool // armed, not yet claimed
	lost  chan struct{}                     // closed once the armed fault was claimed
}

// errReplyLost is what a request whose reply was lost returns: Unavailable,
// which etcd's client does not retry for a request that was sent.
var errReplyLost = status.Error(codes.Unavailable, "test fault: the reply was lost")

// lossyClient is an etcd client on eps whose unary requests pass through
// r, closed when the test ends.
func lossyClient(t testing.TB, eps []string, r *replyLoser) *clientv3.Client {
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(r.intercept)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// arm makes the next request for which match is true lose its reply; the
// channel returned is closed once one did.
func (r *replyLoser) arm(match func(method string, req any) bool) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.match, r.lost = match, make(chan struct{})
	return r.lost
}

func (r *replyLoser) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	r.mu.Lock()
	claim := r.match != nil && r.match(method, req)
	var lost chan struct{}
	if claim {
		r.match, lost = nil, r.lost
	}
	r.mu.Unlock()
	err := invoker(ctx, method, req, reply, cc, opts...)
	if !claim {
		return err
	}
	close(lost)
	if err != nil {
		return err // no reply to lose: the request failed on its own
	}
	return errReplyLost
}

// mustHaveLost fails the test unless the fault armed as lost was claimed.
func mustHaveLost(t testing.TB, lost <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-lost:
	default:
		t.Fatalf("no reply was lost: %s never reached etcd", what)
	}
}

// txnPutUnder matches a transaction that puts a key under prefix (a
// create of a queue entry).
func txnPutUnder(prefix string) func(string, any) bool {
	return txnOp(prefix, func(op *pb.RequestOp) []byte { return op.GetRequestPut().GetKey() })
}

// txnDeleteUnder matches a transaction that deletes a key under prefix (a
// release).
func txnDeleteUnder(prefix string) func(string, any) bool {
	return txnOp(prefix, func(op *pb.RequestOp) []byte { return op.GetRequestDeleteRange().GetKey() })
}

func txnOp(prefix string, key func(*pb.RequestOp) []byte) func(string, any) bool {
	return func(method string, req any) bool {
		txn, ok := req.(*pb.TxnRequest)
		if !ok || method != "/etcdserverpb.KV/Txn" {
			return false
		}
		for _, op := range txn.Success {
			if k := key(op); k != nil && strings.HasPrefix(string(k), prefix) {
				return true
			}
		}
		return false
	}
}

// An etcd member in a child process can be paused (SIGSTOP): requests
// hang rather than fail, and are served again after Resume.
func TestProcessPauseResume(t *testing.T) {
	t.Parallel()
	p := etcdtest.StartProcess(t)
	c := newClient(t, []string{p.ClientURL()})
	if _, err := c.Put(dlocktest.Context(t), "k", "v1"); err != nil {
		t.Fatal(err)
	}
	get := func(ctx context.Context) (string, error) {
		resp, err := c.Get(ctx, "k")
		if err != nil {
			return "", err
		}
		if len(resp.Kvs) != 1 {
			return "", errors.New("key k not found")
		}
		return string(resp.Kvs[0].Value), nil
	}
	if v, err := get(dlocktest.Context(t)); err != nil || v != "v1" {
		t.Fatalf("Get = %q, %v", v, err)
	}

	p.Pause()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	v, err := get(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get from a paused member = %q, %v; want DeadlineExceeded", v, err)
	}

	p.Resume()
	if v, err := get(dlocktest.Context(t)); err != nil || v != "v1" {
		t.Fatalf("Get after Resume = %q, %v", v, err)
	}
	if _, err := c.Put(dlocktest.Context(t), "k", "v2"); err != nil {
		t.Fatal(err)
	}
	if v, err := get(dlocktest.Context(t)); err != nil || v != "v2" {
		t.Fatalf("Get after Put = %q, %v", v, err)
	}
}

// A killed member stays dead (Stop is idempotent, also at cleanup), and a
// paused one can be killed.
func TestProcessStopPaused(t *testing.T) {
	t.Parallel()
	p := etcdtest.StartProcess(t)
	c := newClient(t, []string{p.ClientURL()})
	if _, err := c.Put(dlocktest.Context(t), "k", "v"); err != nil {
		t.Fatal(err)
	}
	p.Pause()
	p.Stop()
	p.Stop()
	p.Resume() // no-op after Stop
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := c.Get(ctx, "k"); err == nil {
		t.Fatal("Get from a killed member succeeded")
	}
}

// A lock held across the loss of the cluster leader is either still held
// (and nobody else can take it) or reported lost; never silently lost.
func TestLeaderLoss(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 3)
	eps := c.Endpoints()
	l := etcdlock.New(newClient(t, eps))
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key, dlock.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	leader := c.Leader()
	if leader == nil {
		t.Fatal("no leader")
	}
	leader.Stop()
	time.Sleep(4 * time.Second) // two TTLs: an election and some renewals
	other := etcdlock.New(newClient(t, c.Endpoints()))
	// Ask the surviving members until they answer (a new leader is elected).
	var tryErr error
	deadline := time.Now().Add(dlocktest.HangTimeout)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		var lk2 *dlock.Lock
		lk2, tryErr = other.TryAcquire(ctx, key)
		cancel()
		if tryErr == nil {
			lk2.Release(context.Background())
		}
		if tryErr == nil || errors.Is(tryErr, dlock.ErrNotAcquired) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	switch {
	case lk.Err() == nil && errors.Is(tryErr, dlock.ErrNotAcquired):
		t.Logf("lock survived the leader change")
	case lk.Err() != nil && errors.Is(lk.Err(), dlock.ErrLockLost):
		t.Logf("lock reported lost across the leader change: %v", lk.Err())
	case lk.Err() == nil && tryErr == nil:
		t.Fatal("SILENT LOSS: another client took the key while the holder believes it holds it")
	default:
		t.Fatalf("holder err %v, other's try %v", lk.Err(), tryErr)
	}
}
