package redisx_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/redisx"
	"github.com/dlock-go/dlock/internal/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// hangBound bounds calls that must not wait on the network; the defects
// they catch wait for go-redis's 5s read timeout and retries.
const hangBound = 4 * time.Second

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newClient(t testing.TB, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr}) // a default client
	t.Cleanup(func() { c.Close() })
	return c
}

func key(t testing.TB) string { return fmt.Sprintf("%s.%d", t.Name(), time.Now().UnixNano()) }

// Closing subscriptions never waits on the link: here the hub's pub/sub
// connection is reconnecting through a stalled link, which holds go-redis's
// PubSub mutex for the read timeout of the handshake.
func TestSubscriptionCloseOnStalledLink(t *testing.T) {
	srv := testserver.StartRedis(t)
	p := testserver.StartProxy(t, srv.Addr())
	t.Cleanup(p.Heal) // before the proxy stops, so the background work ends
	n := redisx.NewNode(newClient(t, p.Addr()), "dlock")
	k := key(t)
	a, err := n.Watch(ctxT(t), k, "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := n.Watch(ctxT(t), k, "b")
	if err != nil {
		t.Fatal(err)
	}
	p.Cut() // the reader's connection dies; reconnecting is refused
	time.Sleep(200 * time.Millisecond)
	p.Heal()
	p.Stall() // the next reconnection hangs in its handshake
	time.Sleep(300 * time.Millisecond)
	for _, s := range []*redisx.Subscription{a, b} {
		done := make(chan struct{})
		start := time.Now()
		go func() { s.Close(); close(done) }()
		select {
		case <-done:
			t.Logf("Close returned after %v", time.Since(start).Round(10*time.Microsecond))
		case <-time.After(hangBound):
			t.Fatalf("Close hung on a stalled link (%v so far)", hangBound)
		}
	}
}

// Waits that end before their SUBSCRIBE was confirmed leave nothing
// subscribed: the hub sends each channel's SUBSCRIBE and UNSUBSCRIBE in
// order, and a subscription that outlives them still hears its releases.
// Here the requests pile up behind a reconnection through a stalled link.
// (The red-team reproducer in redislock, regress_hub_test.go, shows the
// race of the earlier design: requests sent from goroutines of their own.)
func TestHubUnsubscribesEndedWaits(t *testing.T) {
	srv := testserver.StartRedis(t)
	p := testserver.StartProxy(t, srv.Addr())
	t.Cleanup(p.Heal)
	n := redisx.NewNode(newClient(t, p.Addr()), "dlock")
	admin := newClient(t, srv.Addr())
	k := key(t)
	keeper, err := n.Watch(ctxT(t), k, "keeper")
	if err != nil {
		t.Fatal(err)
	}
	defer keeper.Close()
	p.Cut() // the reader's connection dies; reconnecting is refused
	time.Sleep(200 * time.Millisecond)
	p.Heal()
	p.Stall() // the next reconnection hangs in its handshake
	time.Sleep(200 * time.Millisecond)
	for i := range 50 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		if s, err := n.Watch(ctx, k, fmt.Sprint("w", i)); err == nil {
			s.Close() // unconfirmed (the confirmation bound is longer)
		}
		cancel()
	}
	p.Heal()
	want := []string{n.WaiterChannel(k, "keeper")}
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		chans, err := admin.PubSubChannels(ctxT(t), n.WaiterChannel(k, "*")).Result()
		if err == nil && slices.Equal(chans, want) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("subscribed channels: %q (%v), want %q", chans, err, want)
		}
	}
	if err := admin.Publish(ctxT(t), want[0], "1").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-keeper.C():
	case <-time.After(30 * time.Second):
		t.Fatal("hang: the remaining subscription did not hear its channel")
	}
}

// Watch returns within its confirmation bound even when the link stalls
// before the pub/sub connection is made: the waiter then relies on polling.
func TestWatchOnStalledLink(t *testing.T) {
	srv := testserver.StartRedis(t)
	p := testserver.StartProxy(t, srv.Addr())
	t.Cleanup(p.Heal)
	n := redisx.NewNode(newClient(t, p.Addr()), "dlock")
	p.Stall()
	done := make(chan error, 1)
	start := time.Now()
	var s *redisx.Subscription
	go func() {
		var err error
		s, err = n.Watch(context.Background(), key(t), "w")
		done <- err
	}()
	select {
	case err := <-done:
		t.Logf("Watch returned after %v: %v", time.Since(start).Round(time.Millisecond), err)
		if err != nil {
			t.Fatalf("Watch on a stalled link: %v, want an unconfirmed subscription", err)
		}
		s.Close()
	case <-time.After(30 * time.Second):
		t.Fatal("hang: Watch on a stalled link")
	}
}

// An acquisition executed twice for the same owner (go-redis retrying a
// request whose reply was lost) is granted twice, with the same token.
func TestAcquireRetryGrantsSameLease(t *testing.T) {
	srv := testserver.StartRedis(t)
	c := newClient(t, srv.Addr())
	n := redisx.NewNode(c, "dlock")
	k, owner := key(t), strings.Repeat("a", 32)
	first, err := n.Acquire(ctxT(t), k, owner, time.Minute, "{}", "")
	if err != nil || !first.Granted {
		t.Fatalf("Acquire = %+v, %v", first, err)
	}
	again, err := n.Acquire(ctxT(t), k, owner, time.Minute, "{}", "")
	if err != nil || !again.Granted || again.Token != first.Token {
		t.Fatalf("repeated Acquire = %+v, %v; want granted with token %d", again, err, first.Token)
	}
	other, err := n.Acquire(ctxT(t), k, strings.Repeat("b", 32), time.Minute, "{}", "")
	if err != nil || other.Granted || other.Holder.Owner != owner {
		t.Fatalf("another owner: %+v, %v", other, err)
	}
}

// A release that already took effect succeeds again, also after the key
// moved on to the next holder; a lease that expired or was deleted does
// not.
func TestReleaseRecognisesItsOwnRelease(t *testing.T) {
	srv := testserver.StartRedis(t)
	c := newClient(t, srv.Addr())
	n := redisx.NewNode(c, "dlock")
	ctx := ctxT(t)
	k := key(t)
	a, b := strings.Repeat("a", 32), strings.Repeat("b", 32)
	ga, err := n.Acquire(ctx, k, a, time.Minute, "{}", "")
	if err != nil || !ga.Granted {
		t.Fatal(ga, err)
	}
	for i := range 2 {
		if ok, err := n.Release(ctx, k, a, ga.Token, time.Hour); !ok || err != nil {
			t.Fatalf("release %d = %v, %v", i, ok, err)
		}
	}
	gb, err := n.Acquire(ctx, k, b, time.Minute, "{}", "")
	if err != nil || !gb.Granted || gb.Token != ga.Token+1 {
		t.Fatal(gb, err)
	}
	if ok, err := n.Release(ctx, k, a, ga.Token, time.Hour); !ok || err != nil {
		t.Fatalf("release retried while the next holder holds the key = %v, %v", ok, err)
	}
	if ok, err := n.Release(ctx, k, b, gb.Token, time.Hour); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, err := n.Release(ctx, k, a, ga.Token, time.Hour); !ok || err != nil {
		t.Fatalf("release retried after the next holder released = %v, %v", ok, err)
	}
	// Without its token a release cannot tell (an Abort): not held.
	if ok, err := n.Release(ctx, k, a, 0, time.Hour); ok || err != nil {
		t.Fatalf("tokenless release of a released lease = %v, %v", ok, err)
	}
	// A lease deleted behind its holder's back, the key taken again: the
	// late release is refused and leaves the new holder alone.
	k2 := key(t)
	gc, err := n.Acquire(ctx, k2, a, time.Minute, "{}", "")
	if err != nil || !gc.Granted {
		t.Fatal(gc, err)
	}
	if err := c.Del(ctx, n.LockKey(k2)).Err(); err != nil {
		t.Fatal(err)
	}
	gd, err := n.Acquire(ctx, k2, b, time.Minute, "{}", "")
	if err != nil || !gd.Granted {
		t.Fatal(gd, err)
	}
	if ok, err := n.Release(ctx, k2, a, gc.Token, time.Hour); ok || err != nil {
		t.Fatalf("release of a deleted lease = %v, %v, want refused", ok, err)
	}
	if v, _ := c.Get(ctx, n.LockKey(k2)).Result(); !strings.HasPrefix(v, b+"|") {
		t.Fatalf("new holder's value = %q", v)
	}
}

// Redlock's per-node release keeps a marker with the token, so a retried
// release counts as released; a tokenless one (a failed attempt's
// cleanup) deletes the key.
func TestQuorumReleaseRecognisesItsOwnRelease(t *testing.T) {
	srv := testserver.StartRedis(t)
	c := newClient(t, srv.Addr())
	n := redisx.NewNode(c, "dlock")
	ctx := ctxT(t)
	k, a := key(t), strings.Repeat("a", 32)
	g, err := n.Grant(ctx, k, a, time.Minute, "{}", "", 0)
	if err != nil || !g.Granted {
		t.Fatal(g, err)
	}
	tok := g.Token + 1
	if ok, err := n.Commit(ctx, k, a, tok, "{}", time.Hour); !ok || err != nil {
		t.Fatal(ok, err)
	}
	// A retried grant leaves the committed lease as it is.
	if g2, err := n.Grant(ctx, k, a, time.Minute, "{}", "", 0); err != nil || !g2.Granted {
		t.Fatal(g2, err)
	}
	if v, _ := c.Get(ctx, n.LockKey(k)).Result(); v != fmt.Sprintf("%s|%d|{}", a, tok) {
		t.Fatalf("value after a retried grant = %q", v)
	}
	for i := range 2 {
		if ok, err := n.QuorumRelease(ctx, k, a, tok, time.Hour); !ok || err != nil {
			t.Fatalf("release %d = %v, %v", i, ok, err)
		}
	}
	// The marker is free for the next holder.
	if g3, err := n.Grant(ctx, k, strings.Repeat("b", 32), time.Minute, "{}", "", 0); err != nil || !g3.Granted {
		t.Fatal(g3, err)
	}
	k2 := key(t)
	if g, err := n.Grant(ctx, k2, a, time.Minute, "{}", "", 0); err != nil || !g.Granted {
		t.Fatal(g, err)
	}
	if ok, err := n.QuorumRelease(ctx, k2, a, 0, time.Hour); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if n, _ := c.Exists(ctx, n.LockKey(k2)).Result(); n != 0 {
		t.Fatal("a tokenless release left the key")
	}
}

// A retried release is recognised by its receipt however often the key
// changed hands meanwhile, up to Receipts hand-overs; the receipts expire
// ReceiptRetention after the latest hand-over. A lease that was deleted,
// not released, has no receipt; neither has a release without its token.
func TestReleaseReceipts(t *testing.T) {
	srv := testserver.StartRedis(t)
	c := newClient(t, srv.Addr())
	n := redisx.NewNode(c, "dlock")
	ctx := ctxT(t)
	for _, quorum := range []bool{false, true} {
		k := key(t)
		acquire := func(owner string) uint64 {
			t.Helper()
			if quorum {
				g, err := n.Grant(ctx, k, owner, time.Minute, "{}", "", 0)
				if err != nil || !g.Granted {
					t.Fatal(g, err)
				}
				if ok, err := n.Commit(ctx, k, owner, g.Token+1, "{}", time.Hour); !ok || err != nil {
					t.Fatal(ok, err)
				}
				return g.Token + 1
			}
			g, err := n.Acquire(ctx, k, owner, time.Minute, "{}", "")
			if err != nil || !g.Granted {
				t.Fatal(g, err)
			}
			return g.Token
		}
		release := func(owner string, tok uint64) bool {
			t.Helper()
			var ok bool
			var err error
			if quorum {
				ok, err = n.QuorumRelease(ctx, k, owner, tok, time.Hour)
			} else {
				ok, err = n.Release(ctx, k, owner, tok, time.Hour)
			}
			if err != nil {
				t.Fatal(err)
			}
			return ok
		}
		owner := func(i int) string { return fmt.Sprintf("%032x", i+1) }
		first := acquire(owner(0))
		if !release(owner(0), first) {
			t.Fatal("release")
		}
		if l, _ := c.Exists(ctx, n.ReceiptsKey(k)).Result(); l != 0 {
			t.Fatal("a release nobody took over wrote receipts (the marker is the receipt)")
		}
		// Receipts hand-overs: the first release is still recognised while
		// each next holder holds the key and after it released.
		second := uint64(0)
		for i := 1; i <= redisx.Receipts; i++ {
			tok := acquire(owner(i))
			if i == 1 {
				second = tok
			}
			if !release(owner(0), first) {
				t.Fatalf("quorum=%v: retried release not recognised while holder %d holds the key", quorum, i)
			}
			if !release(owner(i), tok) {
				t.Fatal("release")
			}
			if !release(owner(0), first) {
				t.Fatalf("quorum=%v: retried release not recognised after %d hand-overs", quorum, i)
			}
		}
		if release(owner(0), 0) {
			t.Fatalf("quorum=%v: a release without its token recognised", quorum)
		}
		pttl, err := c.PTTL(ctx, n.ReceiptsKey(k)).Result()
		if err != nil || pttl <= 0 || pttl > redisx.ReceiptRetention {
			t.Fatalf("receipts PTTL = %v, %v; want within (0, %v]", pttl, err, redisx.ReceiptRetention)
		}
		if l, _ := c.LLen(ctx, n.ReceiptsKey(k)).Result(); l != redisx.Receipts {
			t.Fatalf("receipts: %d entries, want %d", l, redisx.Receipts)
		}
		// One hand-over more: the first falls out of the receipts. Its
		// retry is reported as not held (documented limit).
		if !release(owner(99), acquire(owner(99))) {
			t.Fatal("release")
		}
		if release(owner(0), first) {
			t.Fatalf("quorum=%v: a release %d hand-overs back still recognised (receipts are capped)", quorum, redisx.Receipts+1)
		}
		if !release(owner(1), second) {
			t.Fatalf("quorum=%v: the second release is no longer recognised", quorum)
		}
		// An owner whose lease was deleted never released: no receipt.
		tok := acquire(owner(100))
		if err := c.Del(ctx, n.LockKey(k)).Err(); err != nil {
			t.Fatal(err)
		}
		if release(owner(100), tok) {
			t.Fatalf("quorum=%v: a lease that was deleted, not released, reported released", quorum)
		}
	}
}

// A waiter that leaves is dequeued once its last attempt in flight has
// returned, also when that attempt queued it after it left (an attempt
// abandoned at its caller's deadline).
func TestWaiterDequeuedAfterAttemptsInFlight(t *testing.T) {
	srv := testserver.StartRedis(t)
	c := newClient(t, srv.Addr())
	n := redisx.NewNode(c, "dlock")
	ctx := ctxT(t)
	k := key(t)
	if g, err := n.Acquire(ctx, k, strings.Repeat("a", 32), time.Minute, "{}", ""); err != nil || !g.Granted {
		t.Fatal(g, err)
	}
	var ws redisx.Waiters
	w := ws.Add(k, "w1", n)
	end := ws.Begin("w1")
	w.Leave()
	// The attempt in flight reaches the server after the waiter left.
	if g, err := n.Acquire(ctx, k, strings.Repeat("b", 32), time.Minute, "{}", "w1"); err != nil || g.Granted {
		t.Fatal(g, err)
	}
	if q, _ := c.ZCard(ctx, n.WaitersKey(k)).Result(); q != 1 {
		t.Fatalf("queue holds %d waiters, want the one in flight", q)
	}
	end()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		q, err := c.ZCard(ctx, n.WaitersKey(k)).Result()
		if err == nil && q == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue holds %d waiters (%v) after the waiter left and its attempt returned", q, err)
		}
	}
	// Attempts begun after it left are not tracked.
	ws.Begin("w1")()
}

// Every encoded key has a non-empty hash tag, and the encoding is
// injective and reversible; keys not starting with '}' are unchanged.
func TestHashTag(t *testing.T) {
	seen := map[string]string{}
	for _, k := range []string{"}", "}x", "}}", "{", "{}", "{a}", "a}b{c", "x", "\x01}", " }", "}{", "日本"} {
		enc := redisx.HashTag(k)
		if redisx.DecodeHashTag(enc) != k {
			t.Errorf("%q: decodes to %q", k, redisx.DecodeHashTag(enc))
		}
		if k[0] != '}' && enc != k {
			t.Errorf("%q: encoded as %q, want unchanged", k, enc)
		}
		full := "dlock:{" + enc + "}"
		open := strings.IndexByte(full, '{')
		if end := strings.IndexByte(full[open+1:], '}'); end <= 0 {
			t.Errorf("%q: empty hash tag in %q", k, full)
		}
		if prev, dup := seen[enc]; dup {
			t.Errorf("%q and %q encode alike", k, prev)
		}
		seen[enc] = k
	}
}
