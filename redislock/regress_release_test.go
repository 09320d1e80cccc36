package redislock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// The holder's release takes effect but its reply is lost (Release returns a
// network error). The key then changes hands twice. The caller retries
// Release, as the docs invite ("after a network error the next call
// retries"; "reports a release whose reply was lost as released"). The
// retry must not report the lock lost: it was released by us, cleanly.
func TestRegressReleaseRetryAfterTwoHandovers(t *testing.T) {
	srv := testserver.StartRedis(t)
	p := testserver.StartProxy(t, srv.Addr())
	c := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { c.Close() })
	l := redislock.New(c)
	other := redislock.New(newClient(t, srv))
	key := dlocktest.Key(t)

	// Warm up: the scripts are cached, so the lost reply is the release's.
	w, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	admin := newClient(t, srv)
	var lk *dlock.Lock
	// go-redis resends the script on a new connection after a short
	// random backoff; if the resend got through before the link was cut,
	// the reply was not lost: try again (bounded).
	for round := 0; ; round++ {
		if lk, err = l.Acquire(dlocktest.Context(t), key); err != nil {
			t.Fatal(err)
		}
		err1 := loseReleaseReply(p, admin, l.LockKey(key), func() error { return lk.Release(dlocktest.Context(t)) })
		t.Logf("first Release: %v", err1)
		if err1 != nil {
			break
		}
		if round == 9 {
			t.Skip("the reply was never lost")
		}
	}
	// The release did take effect: the key is free. Two hand-overs.
	for i := 0; i < 2; i++ {
		o, err := other.TryAcquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatalf("hand-over %d: %v", i, err)
		}
		t.Logf("hand-over %d: token %d (ours was %d)", i, o.Token(), lk.Token())
		if err := o.Release(dlocktest.Context(t)); err != nil {
			t.Fatal(err)
		}
	}
	err2 := lk.Release(dlocktest.Context(t))
	if errors.Is(err2, dlock.ErrLockLost) || errors.Is(err2, dlock.ErrNotHeld) {
		t.Fatalf("retried Release of a lock we released cleanly reports it lost: %v", err2)
	}
	if err2 != nil {
		t.Fatalf("retried Release: %v", err2)
	}
}

// loseReleaseReply runs release with the reply to its request lost, and
// keeps the link dead until go-redis has given up resending: the server
// released, the client got an error (unless go-redis's resend reached the
// server before the link was cut; then release returns nil).
func loseReleaseReply(p *testserver.Proxy, admin *redis.Client, lockKey string, release func() error) error {
	cut := make(chan struct{})
	go func() {
		defer close(cut)
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
			if v, _ := admin.Get(context.Background(), lockKey).Result(); len(v) > 0 && v[0] == '|' {
				p.Cut()
				return
			}
			time.Sleep(200 * time.Microsecond)
		}
	}()
	p.LoseNextReply()
	err := release()
	<-cut
	p.Heal()
	return err
}
