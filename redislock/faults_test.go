package redislock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

func TestLostWhenServerPaused(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	l := redislock.New(newClient(t, srv))
	key := dlocktest.Key(t)
	const ttl = 400 * time.Millisecond
	lk, err := l.Acquire(dlocktest.Context(t), key, dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	paused := time.Now()
	defer srv.Resume()
	select {
	case <-lk.Lost():
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: Lost() not closed while the server was paused")
	}
	// The key cannot have expired on the server before Lost() closed: the
	// server is stopped, so its clock for this key starts after resume. We
	// can at least check the local deadline is before acquire + TTL.
	if !errors.Is(lk.Err(), dlock.ErrLockLost) {
		t.Fatalf("Err() = %v", lk.Err())
	}
	t.Logf("Lost() closed %v after SIGSTOP (ttl %v)", time.Since(paused).Round(time.Millisecond), ttl)
	srv.Resume()
	// After resume the lock becomes free again (cleanup or expiry).
	lk2, err := redislock.New(newClient(t, srv)).Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	if lk2.Token() <= lk.Token() {
		t.Fatalf("token %d after %d", lk2.Token(), lk.Token())
	}
	lk2.Release(dlocktest.Context(t))
}

// The reply to an acquisition is lost on a warm connection, so the script
// itself ran: go-redis sends it again on a new connection, and the repeat
// finds the lease of its own owner. It must be granted (the same lease),
// not reported as held by someone — a phantom that would keep everyone
// out for the TTL.
func TestLostAcquireReplyIsOwnLease(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	p := testserver.StartProxy(t, srv.Addr())
	c := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { c.Close() })
	t.Cleanup(p.Heal)
	l := redislock.New(c)
	// Warm up: the connection is open and the server has the script.
	warm, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	key := dlocktest.Key(t)
	p.LoseNextReply()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lk, err := l.Acquire(ctx, key, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("Acquire with its reply lost: %v", err)
	}
	defer lk.Release(context.Background())
	v, err := newClient(t, srv).Get(dlocktest.Context(t), l.LockKey(key)).Result()
	if err != nil || !strings.HasPrefix(v, lk.Owner()+"|"+strconv.FormatUint(lk.Token(), 10)+"|") {
		t.Fatalf("server holds %q (%v), want the lease of owner %s, token %d", v, err, lk.Owner(), lk.Token())
	}
}

// TestRelease_RetryAfterLostReplyAndTwoHandovers_ReportsReleased: the
// holder's release takes effect but its reply is lost (Release returns a
// network error). The key then changes hands twice. The caller retries
// Release, as the docs invite ("after a network error the next call
// retries"; "reports a release whose reply was lost as released"). The
// retry must not report the lock lost: it was released by us, cleanly.
//
// The holder's client does not resend a request itself (MaxRetries -1):
// a default client resends the script on a new connection after a short
// random backoff, and the resend, answered, would hide the lost reply.
func TestRelease_RetryAfterLostReplyAndTwoHandovers_ReportsReleased(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	p := testserver.StartProxy(t, srv.Addr())
	t.Cleanup(p.Heal)
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	l := redislock.New(c)
	other := redislock.New(newClient(t, srv))
	key := dlocktest.Key(t)

	// Warm up: the scripts are cached, so the lost reply is the release's.
	// The Locker's break listening goes through the proxy too: its
	// subscription is confirmed, and the read of the held lock's key that
	// the confirmation starts is done, before anything else is sent.
	w, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(dlocktest.HangTimeout); !redislock.BreakListening(l); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("hang: the Locker's break subscription never came up")
		}
	}
	if err := w.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	p.LoseNextReply()
	err1 := lk.Release(dlocktest.Context(t))
	t.Logf("first Release: %v", err1)
	if err1 == nil {
		t.Fatal("the release whose reply was lost succeeded: the client resent it")
	}
	if v, err := newClient(t, srv).Get(dlocktest.Context(t), l.LockKey(key)).Result(); err != nil || !strings.HasPrefix(v, "|") {
		t.Fatalf("the key holds %q (%v) after the release whose reply was lost, want its release marker", v, err)
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

// The releases of a semaphore's permits, the last one's included, whose
// replies are lost succeed on retry (their receipts), leave the key free
// for another mode, and the next token is above the last permit's.
func TestRelease_PermitRepliesLost_RetriedToSuccess(t *testing.T) {
	t.Parallel()
	env := standaloneEnv(t)
	l, link := env.Proxied(t)
	key := dlocktest.Key(t)
	p1 := mustTry(t, l, key, dlock.WithLimit(2))
	p2 := mustTry(t, l, key, dlock.WithLimit(2))
	link.LoseNextReply()
	if err := p1.Release(dlocktest.Context(t)); err != nil {
		t.Fatalf("permit release with its reply lost: %v", err)
	}
	link.LoseNextReply()
	if err := p2.Release(dlocktest.Context(t)); err != nil {
		t.Fatalf("last permit release with its reply lost: %v", err)
	}
	w := mustTry(t, env.New(t), key)
	if w.Token() <= p2.Token() {
		t.Fatalf("writer token %d not above the last permit's %d", w.Token(), p2.Token())
	}
	mustRelease(t, w)
}
