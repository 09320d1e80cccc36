package etcdlock_test

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
)

// The connection drops under a Release's request (gRPC reports a reset
// connection as status Unavailable; here the request reached etcd and its
// reply was lost). Symptom guarded against: Release failing with that
// bare gRPC error rather than ErrUnavailable.
func TestRelease_Unavailable_ConnectionDroppedUnderRequest(t *testing.T) {
	t.Parallel()
	_, l, r := lossyLocker(t)
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	lost := r.arm(txnDeleteUnder(l.QueuePrefix(key)))
	err = lk.Release(dlocktest.Context(t))
	mustHaveLost(t, lost, "the Release's delete")
	t.Logf("Release whose connection dropped: %v", err)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Release whose connection dropped: %v, want gRPC's Unavailable kept in the chain", err)
	}
	if !errors.Is(err, dlock.ErrUnavailable) || errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Release whose connection dropped: %v, want ErrUnavailable", err)
	}
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatalf("retried Release: %v", err)
	}
}
