package redisproto_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// WAIT n 0 blocks forever: the timeout sent is never 0.
func TestAckMs(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]int64{
		0: 1, time.Nanosecond: 1, time.Millisecond: 1, 1500 * time.Microsecond: 2, 500 * time.Millisecond: 500,
	} {
		if got := redisproto.AckMs(d); got != want {
			t.Errorf("AckMs(%v) = %d, want %d", d, got, want)
		}
	}
}

// Symptom: AckMs overflowed for a timeout near math.MaxInt64 and sent WAIT n 1.
// AckMs never overflows: a huge timeout (Node.AckTimeout is exported,
// unchecked by redisproto) is a huge WAIT timeout, not 1ms, and a
// negative one is 1ms, never 0 (WAIT n 0 blocks forever).
func TestAckMs_Extremes_NeverOverflowNorZero(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]int64{
		math.MaxInt64:          math.MaxInt64/int64(time.Millisecond) + 1,
		math.MaxInt64 - 1e6:    math.MaxInt64 / int64(time.Millisecond),
		math.MinInt64:          1,
		-time.Second:           1,
		-1:                     1,
		time.Millisecond + 1:   2,
		2*time.Millisecond - 1: 2,
	} {
		if got := redisproto.AckMs(d); got != want {
			t.Errorf("AckMs(%d) = %d, want %d", int64(d), got, want)
		}
	}
}

// On a server without replicas, every write with Acks 1 is applied but
// unacknowledged: grants and renewals come back with an *AckError, also
// when the script cache was flushed (NOSCRIPT: resent as EVAL, with its
// WAIT); refused attempts and renewals of leases not held carry none.
func TestAcksWithoutReplicas(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	c := newClient(t, srv.Addr())
	n := redisproto.NewNode(c, "dlock")
	n.Acks, n.AckTimeout = 1, 50*time.Millisecond
	ctx := dlocktest.Context(t)
	k := key(t)
	a, b := strings.Repeat("a", 32), strings.Repeat("b", 32)
	isAck := func(what string, err error) {
		t.Helper()
		var ae *redisproto.AckError
		if !errors.As(err, &ae) || ae.Want != 1 || ae.Got != 0 || ae.Err != nil {
			t.Fatalf("%s: %v, want 0 of 1 replicas", what, err)
		}
	}
	for _, flush := range []bool{false, true} {
		if flush {
			if _, err := srv.Do("SCRIPT", "FLUSH"); err != nil {
				t.Fatal(err)
			}
		}
		o, err := n.Acquire(ctx, k, a, time.Minute, "{}", "", "")
		if !o.Granted {
			t.Fatalf("acquire: %+v, %v", o, err)
		}
		isAck("acquire", err)
		if o, err := n.Acquire(ctx, k, b, time.Minute, "{}", "", ""); o.Granted || err != nil {
			t.Fatalf("refused acquire: %+v, %v", o, err)
		}
		held, err := n.Refresh(ctx, k, a, time.Minute)
		if !held {
			t.Fatal(held, err)
		}
		isAck("refresh", err)
		if held, err := n.Refresh(ctx, k, b, time.Minute); held || err != nil {
			t.Fatalf("refresh by another owner: %v, %v", held, err)
		}
		if flush {
			if _, err := srv.Do("SCRIPT", "FLUSH"); err != nil {
				t.Fatal(err)
			}
		}
		got := map[int]error{}
		heldBy := map[int]bool{}
		n.RefreshBatch(ctx, []redisproto.Renewal{{Key: k, Owner: a, TTL: time.Minute}, {Key: k, Owner: b, TTL: time.Minute}},
			func(i int, held bool, err error) { got[i], heldBy[i] = err, held })
		if !heldBy[0] || heldBy[1] || got[1] != nil {
			t.Fatalf("batch: held %v, errors %v", heldBy, got)
		}
		isAck("batch renewal", got[0])
		if ok, err := n.Release(ctx, k, a, o.Token, time.Hour); !ok || err != nil {
			t.Fatalf("release: %v, %v", ok, err)
		}
	}
	// A group grant too.
	o, err := n.AcquireGroup(ctx, k+"g", a, time.Minute, "{}", "", 0)
	if !o.Granted {
		t.Fatalf("acquire_group: %+v, %v", o, err)
	}
	isAck("acquire_group", err)
	held, err := n.RefreshGroup(ctx, k+"g", a, time.Minute)
	if !held {
		t.Fatal(held, err)
	}
	isAck("refresh_group", err)
}
