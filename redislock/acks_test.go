package redislock_test

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// Every grant's token is at least the server's time in µs, also over a
// release marker: a primary promoted after a failover that missed the
// latest marker (here: a marker far behind, set by hand) still issues a
// token above every earlier one.
func TestTokenFloorOverMarker(t *testing.T) {
	srv := testserver.StartRedis(t)
	l := redislock.New(newClient(t, srv))
	for _, exclusive := range []bool{true, false} {
		key := dlocktest.Key(t)
		if exclusive {
			key += "-x"
		}
		if _, err := srv.Do("SET", l.LockKey(key), "|5", "PX", "60000"); err != nil {
			t.Fatal(err)
		}
		before := uint64(time.Now().Add(-time.Minute).UnixMicro()) // generous: the server's clock is the host's
		var opts []dlock.Option
		if !exclusive {
			opts = append(opts, dlock.WithShared())
		}
		lk, err := l.TryAcquire(dlocktest.Context(t), key, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if lk.Token() < before {
			t.Errorf("exclusive=%v: token over the marker |5 = %d, want at least the server time in µs (~%d)", exclusive, lk.Token(), before)
		}
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Fatal(err)
		}
	}
}
