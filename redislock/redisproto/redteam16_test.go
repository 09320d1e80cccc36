package redisproto_test

import (
	"math"
	"testing"
	"time"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// Red team, issue 16 (replica acknowledgement).

// AckMs never overflows: a huge timeout (Node.AckTimeout is exported,
// unchecked by redisproto) is a huge WAIT timeout, not 1ms, and a
// negative one is 1ms, never 0 (WAIT n 0 blocks forever).
func TestRedTeam16_AckMsExtremes(t *testing.T) {
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

// A release retried (its reply lost) after the next holder took over its
// marker: now that every token is at least the server clock in µs, the
// next token is rarely the marker's + 1, so the retry must be recognised
// by its receipt: released already, and the new holder's lease untouched.
func TestRedTeam16_ReleaseRetryAfterTakeover(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	n := redisproto.NewNode(newClient(t, srv.Addr()), "dlock")
	ctx := dlocktest.Context(t)
	k := key(t)
	a, b := "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	oa, err := n.Acquire(ctx, k, a, time.Minute, "{}", "", "")
	if err != nil || !oa.Granted {
		t.Fatal(oa, err)
	}
	if ok, err := n.Release(ctx, k, a, oa.Token, time.Hour); !ok || err != nil {
		t.Fatal(ok, err)
	}
	ob, err := n.Acquire(ctx, k, b, time.Minute, "{}", "", "")
	if err != nil || !ob.Granted || ob.Token <= oa.Token {
		t.Fatalf("%+v, %v: want a grant above %d", ob, err, oa.Token)
	}
	if ob.Token == oa.Token+1 {
		t.Logf("the next token is the marker's + 1 (the clock was behind it)")
	}
	if ok, err := n.Release(ctx, k, a, oa.Token, time.Hour); !ok || err != nil {
		t.Fatalf("the retried release: %v, %v; want released already", ok, err)
	}
	if v, _ := srv.Do("GET", n.LockKey(k)); len(v) < len(b) || v[:len(b)] != b {
		t.Fatalf("the key holds %q after the retried release, want %s's lease", v, b)
	}
}
