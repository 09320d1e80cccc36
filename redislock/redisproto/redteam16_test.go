package redisproto_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// Red team, issue 16 (replica acknowledgement).

// AckMs never overflows: a huge timeout (Node.AckTimeout is exported,
// unchecked by redisproto) is a huge WAIT timeout, not 1ms, and a
// negative one is 1ms, never 0 (WAIT n 0 blocks forever).
func TestRedTeam16_AckMsExtremes(t *testing.T) {
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

// EvalThenWait on a server without replicas: a script that wrote is
// followed by WAIT (0 of 1 acknowledged); one that did not, or failed,
// is not, and returns at once, whatever the timeout.
func TestRedTeam16_EvalThenWait(t *testing.T) {
	srv := testserver.StartRedis(t)
	c := newClient(t, srv.Addr())
	ctx := dlocktest.Context(t)
	k := key(t)
	const long = 5 * time.Second
	set := redis.NewScript(`return redis.call('SET', KEYS[1], ARGV[1])`)
	cmd, err := redisproto.EvalThenWait(ctx, c, set, []string{k}, 1, 50*time.Millisecond, func(*redis.Cmd) bool { return true }, "v")
	var ae *redisproto.AckError
	if cmd.Err() != nil || !errors.As(err, &ae) || ae.Got != 0 || ae.Want != 1 {
		t.Fatalf("a write without replicas: %v, %v; want 0 of 1 acknowledged", cmd.Err(), err)
	}
	start := time.Now()
	cmd, err = redisproto.EvalThenWait(ctx, c, set, []string{k}, 1, long, func(*redis.Cmd) bool { return false }, "v")
	if cmd.Err() != nil || err != nil {
		t.Fatalf("a script that says it wrote nothing: %v, %v", cmd.Err(), err)
	}
	fail := redis.NewScript(`return redis.error_reply('NOPE')`)
	cmd, err = redisproto.EvalThenWait(ctx, c, fail, []string{k}, 1, long, func(*redis.Cmd) bool { return true })
	if cmd.Err() == nil || err != nil {
		t.Fatalf("a failing script: %v, %v; want its error on the command and no ack error", cmd.Err(), err)
	}
	if took := time.Since(start); took >= long {
		t.Errorf("scripts that wrote nothing took %v: they waited for WAIT's timeout %v", took, long)
	}
	if _, err := srv.Do("SCRIPT", "FLUSH"); err != nil { // NOSCRIPT: resent as EVAL
		t.Fatal(err)
	}
	cmd, err = redisproto.EvalThenWait(ctx, c, set, []string{k}, 1, 50*time.Millisecond, func(*redis.Cmd) bool { return true }, "w")
	if cmd.Err() != nil || !errors.As(err, &ae) {
		t.Fatalf("a write after SCRIPT FLUSH: %v, %v", cmd.Err(), err)
	}
	if v, _ := srv.Do("GET", k); v != "w" {
		t.Fatalf("the key holds %q, want w", v)
	}
}

// A release retried (its reply lost) after the next holder took over its
// marker: now that every token is at least the server clock in µs, the
// next token is rarely the marker's + 1, so the retry must be recognised
// by its receipt: released already, and the new holder's lease untouched.
func TestRedTeam16_ReleaseRetryAfterTakeover(t *testing.T) {
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
