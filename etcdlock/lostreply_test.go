package etcdlock_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

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
