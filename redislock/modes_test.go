package redislock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// modeEnv is a deployment for the mode tests: standalone or Cluster.
type modeEnv struct {
	// Admin is a client of the deployment, for reading its keys.
	Admin redis.UniversalClient
	// New returns a Locker on a default client of its own.
	New func(t testing.TB) *redislock.Locker
	// Proxied returns a Locker whose every connection goes through fault
	// proxies, and the proxies.
	Proxied func(t testing.TB) (*redislock.Locker, dlocktest.Link)
}

func standaloneEnv(t *testing.T) modeEnv {
	srv := testserver.StartRedis(t)
	return modeEnv{
		Admin: newClient(t, srv),
		New:   func(t testing.TB) *redislock.Locker { return redislock.New(newClient(t, srv)) },
		Proxied: func(t testing.TB) (*redislock.Locker, dlocktest.Link) {
			p := testserver.StartProxy(t, srv.Addr())
			c := redis.NewClient(&redis.Options{Addr: p.Addr()})
			t.Cleanup(func() { c.Close() })
			t.Cleanup(p.Heal)
			return redislock.New(c), p
		},
	}
}

func clusterEnv(t *testing.T) modeEnv {
	tc := startCluster(t)
	return modeEnv{
		Admin: tc.admin,
		New:   func(t testing.TB) *redislock.Locker { return redislock.New(tc.client(t, nil)) },
		Proxied: func(t testing.TB) (*redislock.Locker, dlocktest.Link) {
			var link testserver.Proxies
			via := map[string]string{}
			for _, n := range tc.nodes {
				p := testserver.StartProxy(t, n.Addr())
				link = append(link, p)
				via[n.Addr()] = p.Addr()
			}
			t.Cleanup(link.Heal)
			return redislock.New(tc.client(t, via)), link
		},
	}
}

// TestModes runs the shared and limited tests on a standalone server and
// on a three-master Cluster.
func TestModes(t *testing.T) {
	t.Parallel()
	for _, d := range []struct {
		name string
		env  func(t *testing.T) modeEnv
	}{{"Standalone", standaloneEnv}, {"Cluster", clusterEnv}} {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			env := d.env(t)
			for _, tc := range []struct {
				name string
				f    func(t *testing.T, env modeEnv)
			}{
				{"SharedHolders", testSharedHolders},
				{"WriterPreference", testWriterPreference},
				{"ReadersFollowWriter", testReadersFollowWriter},
				{"WriterLeaves", testWriterLeaves},
				{"DeadWriterExpires", testDeadWriterExpires},
				{"CrashedReader", testCrashedReader},
				{"Semaphore", testSemaphore},
				{"CrashedPermit", testCrashedPermit},
				{"PermitWakesWaiter", testPermitWakesWaiter},
				{"LostSharedAcquireReply", testLostSharedAcquireReply},
				{"LostSharedReleaseReply", testLostSharedReleaseReply},
				{"ListModes", testListModes},
			} {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					tc.f(t, env)
				})
			}
		})
	}
}

func mustTry(t *testing.T, l dlock.Locker, key string, opts ...dlock.Option) *dlock.Lock {
	t.Helper()
	lk, err := l.TryAcquire(dlocktest.Context(t), key, opts...)
	if err != nil {
		t.Fatalf("TryAcquire %q %v: %v", key, opts, err)
	}
	t.Cleanup(func() { _ = lk.Release(context.Background()) })
	return lk
}

func mustRelease(t *testing.T, lk *dlock.Lock) {
	t.Helper()
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// refused asserts that a TryAcquire is refused as held and returns the
// error.
func refused(t *testing.T, l dlock.Locker, key string, opts ...dlock.Option) *dlock.NotAcquiredError {
	t.Helper()
	lk, err := l.TryAcquire(dlocktest.Context(t), key, opts...)
	var na *dlock.NotAcquiredError
	if !errors.As(err, &na) {
		if lk != nil {
			_ = lk.Release(context.Background())
		}
		t.Fatalf("TryAcquire %q %v: %v, want a NotAcquiredError", key, opts, err)
	}
	return na
}

// eventually polls f every 20ms until it is true or within is over.
func eventually(t *testing.T, within time.Duration, what string, f func() bool) {
	t.Helper()
	for end := time.Now().Add(within); ; {
		if f() {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A waiter polls again after its backoff step, shortened to when a lease
// it was refused by ends and, for a waiting writer, to a third of its own
// TTL. wakeOnly (a waiter's options) and wakeTTL (the holders' TTL) put
// every such poll beyond dlocktest.HangTimeout: a waiter with them that
// is granted within that bound was woken by a release, not by polling.
const wakeTTL = 10 * time.Minute

var wakeOnly = []dlock.Option{dlock.WithBackoff(dlock.ConstBackoff{Delay: time.Hour}), dlock.WithTTL(wakeTTL)}

// wakeCtx is a context for a waiter with wakeOnly: longer than the bound
// on its wake-up, ended at cleanup.
func wakeCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*dlocktest.HangTimeout)
	t.Cleanup(cancel)
	return ctx
}

// protoKeys names the keys of a lock (redisproto's layout, the default
// prefix); it has no client.
var protoKeys = redisproto.NewNode(nil, redislock.DefaultPrefix)

// serverMs is the server's time, in ms (Redis TIME), as the scripts read
// it.
func serverMs(t *testing.T, c redis.UniversalClient) int64 {
	t.Helper()
	tm, err := c.Time(dlocktest.Context(t)).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return tm.UnixMilli()
}

// waitServerPast waits (bounded by dlocktest.HangTimeout) until the
// server's time is past ms.
func waitServerPast(t *testing.T, c redis.UniversalClient, ms int64) {
	t.Helper()
	for end := time.Now().Add(dlocktest.HangTimeout); serverMs(t, c) <= ms; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("hang: the server's clock did not pass %d within %v", ms, dlocktest.HangTimeout)
		}
	}
}

// waitHolderEnded waits (bounded by dlocktest.HangTimeout) until the
// server's clock is past the end of owner's lease as a shared or limited
// holder of key (its score in the holders' set). An entry already gone
// ended before: the scripts drop expired holders, and the set expires
// with its latest holder.
func waitHolderEnded(t *testing.T, c redis.UniversalClient, key, owner string) {
	t.Helper()
	end, err := c.ZScore(dlocktest.Context(t), protoKeys.HoldersKey(key), owner).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return
	case err != nil:
		t.Fatalf("the holders' set of %s: %v", key, err)
	}
	waitServerPast(t, c, int64(end))
}

// Each reader is its own lease (owner, token); a writer is refused, with
// every reader named, until the last reader left, and its token is above
// theirs; a reader's release leaves the others held.
func testSharedHolders(t *testing.T, env modeEnv) {
	a, b := env.New(t), env.New(t)
	key := dlocktest.Key(t)
	r1 := mustTry(t, a, key, dlock.WithShared())
	r2 := mustTry(t, b, key, dlock.WithShared(), dlock.WithMetadata("role", "r2"))
	if r1.Owner() == r2.Owner() || r2.Token() <= r1.Token() {
		t.Fatalf("readers %s/%d and %s/%d: want distinct owners, increasing tokens", r1.Owner(), r1.Token(), r2.Owner(), r2.Token())
	}
	na := refused(t, b, key)
	if len(na.Holders) != 2 || na.Holders[0].Owner != r1.Owner() || na.Holders[1].Owner != r2.Owner() ||
		na.Holders[1].Metadata["role"] != "r2" || na.Holders[0].Mode != dlock.Shared || na.Holders[0].TTL <= 0 {
		t.Fatalf("writer refused with holders %+v, want r1 then r2, shared, with TTLs", na.Holders)
	}
	refused(t, a, key, dlock.WithLimit(3)) // modes do not mix
	mustRelease(t, r1)
	select {
	case <-r2.Lost():
		t.Fatal("r2 lost when r1 released")
	default:
	}
	if na := refused(t, b, key); len(na.Holders) != 1 || na.Holders[0].Owner != r2.Owner() {
		t.Fatalf("writer refused with holders %+v, want r2 alone", na.Holders)
	}
	if err := r2.Refresh(dlocktest.Context(t)); err != nil {
		t.Fatalf("r2 refresh: %v", err)
	}
	mustRelease(t, r2)
	w := mustTry(t, a, key)
	if w.Token() <= r2.Token() {
		t.Fatalf("writer token %d not above the readers' %d", w.Token(), r2.Token())
	}
	if na := refused(t, b, key, dlock.WithShared()); len(na.Holders) != 1 || na.Holders[0].Owner != w.Owner() {
		t.Fatalf("reader refused with holders %+v, want the writer", na.Holders)
	}
	mustRelease(t, w)
	r3 := mustTry(t, b, key, dlock.WithShared())
	if r3.Token() <= w.Token() {
		t.Fatalf("reader token %d not above the writer's %d", r3.Token(), w.Token())
	}
	// A released reader's Refresh and Release report the lease gone.
	if err := r1.Refresh(dlocktest.Context(t)); err == nil {
		t.Fatal("refresh of a released reader: no error")
	}
}

// acquireInBackground starts a blocking Acquire and returns its result
// channel.
func acquireInBackground(ctx context.Context, l dlock.Locker, key string, opts ...dlock.Option) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		lk, err := l.Acquire(ctx, key, opts...)
		ch <- acquired{lk, err}
	}()
	return ch
}

type acquired struct {
	lk  *dlock.Lock
	err error
}

// waitRegistered waits until a shared TryAcquire is refused for a waiting
// writer (the writer's first refused attempt registered it).
func waitRegistered(t *testing.T, l dlock.Locker, key string) {
	t.Helper()
	eventually(t, dlocktest.HangTimeout, "the writer's registration", func() bool {
		lk, err := l.TryAcquire(dlocktest.Context(t), key, dlock.WithShared())
		if err == nil {
			_ = lk.Release(dlocktest.Context(t))
			return false
		}
		return strings.Contains(err.Error(), "writer preference")
	})
}

// Once a writer waits, new readers are refused, though readers hold; the
// last reader's release hands the key to the writer, and readers enter
// after it.
func testWriterPreference(t *testing.T, env modeEnv) {
	rl, wl := env.New(t), env.New(t)
	key := dlocktest.Key(t)
	r1 := mustTry(t, rl, key, dlock.WithShared())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got := acquireInBackground(ctx, wl, key)
	waitRegistered(t, rl, key)
	na := refused(t, rl, key, dlock.WithShared())
	if len(na.Holders) != 1 || na.Holders[0].Owner != r1.Owner() {
		t.Errorf("reader refused with holders %+v, want r1", na.Holders)
	}
	// A blocking reader waits behind the writer.
	rgot := acquireInBackground(ctx, rl, key, dlock.WithShared())
	mustRelease(t, r1)
	w := <-got
	if w.err != nil {
		t.Fatalf("writer: %v", w.err)
	}
	if w.lk.Token() <= r1.Token() {
		t.Fatalf("writer token %d not above the reader's %d", w.lk.Token(), r1.Token())
	}
	select {
	case r := <-rgot:
		t.Fatalf("reader granted while the writer holds: %+v", r)
	case <-time.After(200 * time.Millisecond):
	}
	mustRelease(t, w.lk)
	r := <-rgot
	if r.err != nil {
		t.Fatalf("reader after the writer: %v", r.err)
	}
	if r.lk.Token() <= w.lk.Token() {
		t.Fatalf("reader token %d not above the writer's %d", r.lk.Token(), w.lk.Token())
	}
	mustRelease(t, r.lk)
	// TryAcquire of a writer does not register.
	r4 := mustTry(t, rl, key, dlock.WithShared())
	refused(t, wl, key)
	mustTry(t, rl, key, dlock.WithShared())
	mustRelease(t, r4)
}

// Readers that queued behind a waiting writer all enter once it is done,
// woken one after the other (each granted reader pokes the next), not by
// polling (wakeOnly).
func testReadersFollowWriter(t *testing.T, env modeEnv) {
	rl, wl := env.New(t), env.New(t)
	key := dlocktest.Key(t)
	r1 := mustTry(t, rl, key, dlock.WithShared(), dlock.WithTTL(wakeTTL))
	ctx := wakeCtx(t)
	got := acquireInBackground(ctx, wl, key, wakeOnly...)
	waitRegistered(t, rl, key)
	var readers []<-chan acquired
	for range 3 {
		readers = append(readers, acquireInBackground(ctx, env.New(t), key, append([]dlock.Option{dlock.WithShared()}, wakeOnly...)...))
	}
	waitQueued(t, env.Admin, protoKeys.WaitersKey(key), 4) // the writer and the three readers
	mustRelease(t, r1)
	var w acquired
	select {
	case w = <-got:
		if w.err != nil {
			t.Fatalf("writer: %v", w.err)
		}
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("the last reader's release did not wake the writer")
	}
	mustRelease(t, w.lk)
	timeout := time.After(dlocktest.HangTimeout)
	for i, ch := range readers {
		select {
		case r := <-ch:
			if r.err != nil {
				t.Fatalf("reader %d: %v", i, r.err)
			}
			if r.lk.Token() <= w.lk.Token() {
				t.Errorf("reader token %d not above the writer's %d", r.lk.Token(), w.lk.Token())
			}
			defer mustRelease(t, r.lk)
		case <-timeout:
			t.Fatalf("reader %d not woken after the writer released", i)
		}
	}
}

// A writer whose Acquire ended without the key withdraws its registration:
// readers enter again without waiting for it to expire.
func testWriterLeaves(t *testing.T, env modeEnv) {
	rl, wl := env.New(t), env.New(t)
	key := dlocktest.Key(t)
	r1 := mustTry(t, rl, key, dlock.WithShared())
	ctx, cancel := context.WithCancel(context.Background())
	got := acquireInBackground(ctx, wl, key, dlock.WithTTL(time.Minute))
	waitRegistered(t, rl, key)
	cancel()
	if w := <-got; w.err == nil {
		t.Fatal("cancelled writer granted")
	}
	// The registration would last a minute; Leave withdraws it at once.
	eventually(t, dlocktest.HangTimeout, "a reader after the writer left", func() bool {
		lk, err := rl.TryAcquire(dlocktest.Context(t), key, dlock.WithShared())
		if err != nil {
			return false
		}
		_ = lk.Release(dlocktest.Context(t))
		return true
	})
	mustRelease(t, r1)
}

// A writer that died while waiting (its link cut: no Leave reaches the
// server) keeps readers out until its registration expires, one TTL after
// its last attempt, and no longer. Asserted against the server's clock:
// the registration ends at most a TTL after the cut; a reader refused for
// it was refused before it ended, and one admitted was admitted after.
func testDeadWriterExpires(t *testing.T, env modeEnv) {
	rl := env.New(t)
	wl, link := env.Proxied(t)
	key := dlocktest.Key(t)
	r1 := mustTry(t, rl, key, dlock.WithShared())
	const ttl = 3 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := acquireInBackground(ctx, wl, key, dlock.WithTTL(ttl))
	waitRegistered(t, rl, key)
	link.Cut()
	cancel()
	<-got
	// registration reads the end of the dead writer's registration and
	// checks it is at most a TTL after the server's time read right after
	// it (an attempt of the writer's sent before the cut may still land
	// after; its registration ends later, and is read again below).
	registration := func() (int64, bool) {
		t.Helper()
		regs, err := env.Admin.ZRangeWithScores(dlocktest.Context(t), protoKeys.WritersKey(key), 0, -1).Result()
		if err != nil || len(regs) > 1 {
			t.Fatalf("the dead writer's registration: %+v, %v; want one", regs, err)
		}
		if len(regs) == 0 {
			return 0, false // expired, and dropped by a script
		}
		until, now := int64(regs[0].Score), serverMs(t, env.Admin)
		if until > now+ttl.Milliseconds() {
			t.Fatalf("the dead writer's registration ends %dms after the server's time, its TTL is %v", until-now, ttl)
		}
		return until, true
	}
	until, ok := registration()
	if !ok { // a starved test: the registration already ended
		t.Logf("the dead writer's registration ended before it was read")
	}
	refusals := 0
	for end := time.Now().Add(dlocktest.HangTimeout); ; time.Sleep(20 * time.Millisecond) {
		before := serverMs(t, env.Admin)
		lk, err := rl.TryAcquire(dlocktest.Context(t), key, dlock.WithShared())
		after := serverMs(t, env.Admin)
		if err == nil {
			_ = lk.Release(dlocktest.Context(t))
			if after < until {
				t.Fatalf("a reader was admitted by %d, while the dead writer's registration lasted (until %d)", after, until)
			}
			break
		}
		if !strings.Contains(err.Error(), "writer preference") {
			t.Fatalf("reader refused with %v, want the writer-preference refusal", err)
		}
		if before > until {
			if u, ok := registration(); ok && u > until {
				until = u // a late attempt of the writer's registered it again
				continue
			}
			t.Fatalf("a reader was refused for the dead writer at %d, %dms after its registration ended", before, before-until)
		}
		refusals++
		if time.Now().After(end) {
			t.Fatalf("hang: readers still kept out %v after the writer died", dlocktest.HangTimeout)
		}
	}
	t.Logf("readers refused %d times while the dead writer's registration lasted, admitted after", refusals)
	mustRelease(t, r1)
}

// A crashed reader (its lease left to expire) frees its share at its own
// expiry: another reader keeps its lease, and a waiting writer gets the
// key once the live reader leaves.
func testCrashedReader(t *testing.T, env modeEnv) {
	a, b, wl := env.New(t), env.New(t), env.New(t)
	key := dlocktest.Key(t)
	const ttl = 2 * time.Second // a grant that takes a starved machine long still has validity left
	crashed := mustTry(t, a, key, dlock.WithShared(), dlock.WithTTL(ttl), dlock.WithAutoRefresh(false))
	// The live reader is renewed: a TTL a starved process still renews in
	// time.
	live := mustTry(t, b, key, dlock.WithShared(), dlock.WithTTL(5*time.Second))
	// Past the server-side expiry of the crashed reader's lease.
	waitHolderEnded(t, env.Admin, key, crashed.Owner())
	na := refused(t, wl, key)
	if len(na.Holders) != 1 || na.Holders[0].Owner != live.Owner() {
		t.Fatalf("writer refused with holders %+v, want the live reader alone", na.Holders)
	}
	select {
	case <-live.Lost():
		t.Fatalf("the live reader lost its lease: %v", live.Err())
	default:
	}
	mustRelease(t, live)

	// A writer waiting on a crashed reader alone gets the key once the
	// reader's lease ends.
	crashed = mustTry(t, a, key, dlock.WithShared(), dlock.WithTTL(ttl), dlock.WithAutoRefresh(false))
	w, err := wl.Acquire(dlocktest.Context(t), key, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("writer behind a crashed reader: %v", err)
	}
	if w.Token() <= crashed.Token() {
		t.Fatalf("writer token %d not above the crashed reader's %d", w.Token(), crashed.Token())
	}
	mustRelease(t, w)
}

// A semaphore of 2: two permits, a third refused, another limit is an
// ErrLimitMismatch naming both limits, another mode is refused; a permit
// released lets the next in.
func testSemaphore(t *testing.T, env modeEnv) {
	l := env.New(t)
	key := dlocktest.Key(t)
	p1 := mustTry(t, l, key, dlock.WithLimit(2))
	p2 := mustTry(t, env.New(t), key, dlock.WithLimit(2))
	if p2.Token() <= p1.Token() || p1.Owner() == p2.Owner() {
		t.Fatalf("permits %s/%d and %s/%d", p1.Owner(), p1.Token(), p2.Owner(), p2.Token())
	}
	if na := refused(t, l, key, dlock.WithLimit(2)); len(na.Holders) != 2 || na.Holders[0].Mode != dlock.Limited {
		t.Fatalf("third permit refused with holders %+v, want the two permits", na.Holders)
	}
	_, err := l.TryAcquire(dlocktest.Context(t), key, dlock.WithLimit(3))
	if !errors.Is(err, dlock.ErrLimitMismatch) || !strings.Contains(err.Error(), "2") || !strings.Contains(err.Error(), "3") {
		t.Fatalf("limit 3 on a semaphore of 2: %v, want ErrLimitMismatch naming 2 and 3", err)
	}
	refused(t, l, key)
	refused(t, l, key, dlock.WithShared())
	mustRelease(t, p1)
	p3 := mustTry(t, l, key, dlock.WithLimit(2))
	if p3.Token() <= p2.Token() {
		t.Fatalf("permit token %d not above %d", p3.Token(), p2.Token())
	}
	mustRelease(t, p2)
	mustRelease(t, p3)
	// Free again: the next grant sets mode and limit afresh.
	p4 := mustTry(t, l, key, dlock.WithLimit(5))
	mustRelease(t, p4)
	w := mustTry(t, l, key)
	if w.Token() <= p4.Token() {
		t.Fatalf("writer token %d not above the permit's %d", w.Token(), p4.Token())
	}
}

// A crashed permit holder's permit frees at its expiry.
func testCrashedPermit(t *testing.T, env modeEnv) {
	l := env.New(t)
	key := dlocktest.Key(t)
	const ttl = 2 * time.Second // a grant that takes a starved machine long still has validity left
	crashed := mustTry(t, l, key, dlock.WithLimit(1), dlock.WithTTL(ttl), dlock.WithAutoRefresh(false))
	refused(t, l, key, dlock.WithLimit(1))
	p, err := env.New(t).Acquire(dlocktest.Context(t), key, dlock.WithLimit(1))
	if err != nil {
		t.Fatalf("permit behind a crashed holder: %v", err)
	}
	if p.Token() <= crashed.Token() {
		t.Fatalf("token %d not above the crashed holder's %d", p.Token(), crashed.Token())
	}
	mustRelease(t, p)
}

// A released permit wakes a waiter for it (wakeOnly: it never polls
// within the test).
func testPermitWakesWaiter(t *testing.T, env modeEnv) {
	key := dlocktest.Key(t)
	p1 := mustTry(t, env.New(t), key, dlock.WithLimit(2), dlock.WithTTL(wakeTTL))
	p2 := mustTry(t, env.New(t), key, dlock.WithLimit(2), dlock.WithTTL(wakeTTL))
	got := acquireInBackground(wakeCtx(t), env.New(t), key, append([]dlock.Option{dlock.WithLimit(2)}, wakeOnly...)...)
	waitQueued(t, env.Admin, protoKeys.WaitersKey(key), 1) // the waiter's first attempt queued it
	mustRelease(t, p1)
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("permit waiter: %v", r.err)
		}
		mustRelease(t, r.lk)
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("the released permit did not wake the waiter")
	}
	mustRelease(t, p2)
}

// A shared acquisition whose reply is lost is granted its own lease: one
// holder on the server, the lock's own, not a phantom reader.
func testLostSharedAcquireReply(t *testing.T, env modeEnv) {
	l, link := env.Proxied(t)
	warm := mustTry(t, l, dlocktest.Key(t), dlock.WithShared()) // connections and scripts ready
	mustRelease(t, warm)
	key := dlocktest.Key(t)
	link.LoseNextReply()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lk, err := l.Acquire(ctx, key, dlock.WithShared(), dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("shared Acquire with its reply lost: %v", err)
	}
	defer lk.Release(context.Background())
	ls := env.New(t)
	eventually(t, dlocktest.HangTimeout, "one holder, the lock's own", func() bool {
		infos, err := ls.List(dlocktest.Context(t), key)
		return err == nil && len(infos) == 1 && len(infos[0].Holders) == 1 &&
			infos[0].Holders[0].Owner == lk.Owner() && infos[0].Holders[0].Token == lk.Token()
	})
	if err := lk.Refresh(dlocktest.Context(t)); err != nil {
		t.Fatalf("refresh: %v", err)
	}
}

// A reader's release whose reply is lost succeeds (the retry finds the
// receipt), and the key is free.
func testLostSharedReleaseReply(t *testing.T, env modeEnv) {
	l, link := env.Proxied(t)
	key := dlocktest.Key(t)
	r1 := mustTry(t, l, key, dlock.WithShared())
	r2 := mustTry(t, env.New(t), key, dlock.WithShared())
	link.LoseNextReply()
	if err := r1.Release(dlocktest.Context(t)); err != nil {
		t.Fatalf("release with its reply lost: %v", err)
	}
	if na := refused(t, l, key); len(na.Holders) != 1 || na.Holders[0].Owner != r2.Owner() {
		t.Fatalf("writer refused with holders %+v, want r2 alone", na.Holders)
	}
	mustRelease(t, r2)
	mustRelease(t, mustTry(t, l, key))
}

// List shows a shared key's mode and every reader, a semaphore's limit.
func testListModes(t *testing.T, env modeEnv) {
	l := env.New(t)
	key := dlocktest.Key(t)
	r1 := mustTry(t, l, key+"/r", dlock.WithShared(), dlock.WithMetadata("n", "1"))
	r2 := mustTry(t, l, key+"/r", dlock.WithShared(), dlock.WithMetadata("n", "2"))
	p1 := mustTry(t, l, key+"/s", dlock.WithLimit(3))
	x := mustTry(t, l, key+"/x")
	infos, err := l.List(dlocktest.Context(t), key+"/")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 3 {
		t.Fatalf("List = %+v, want 3 keys", infos)
	}
	r, s, xi := infos[0], infos[1], infos[2]
	if r.Mode != dlock.Shared || len(r.Holders) != 2 || r.Holders[0].Owner != r1.Owner() || r.Holders[1].Owner != r2.Owner() ||
		r.Holders[0].Token != r1.Token() || r.Holders[1].Metadata["n"] != "2" || r.Holders[0].TTL <= 0 || r.Holders[1].Mode != dlock.Shared {
		t.Errorf("shared key listed as %+v", r)
	}
	if s.Mode != dlock.Limited || s.Limit != 3 || len(s.Holders) != 1 || s.Holders[0].Owner != p1.Owner() || s.Holders[0].Mode != dlock.Limited {
		t.Errorf("semaphore listed as %+v", s)
	}
	if xi.Mode != dlock.Exclusive || len(xi.Holders) != 1 || xi.Holders[0].Owner != x.Owner() {
		t.Errorf("exclusive key listed as %+v", xi)
	}
	mustRelease(t, r1)
	mustRelease(t, r2)
	mustRelease(t, p1)
	mustRelease(t, x)
	if infos, err := l.List(dlocktest.Context(t), key+"/"); err != nil || len(infos) != 0 {
		t.Errorf("List after the releases = %+v, %v", infos, err)
	}
}

// TestModes_WriterQueuedBehindReaders_GrantedFirst: two blocking readers
// queued ahead of a blocking writer behind an exclusive holder. The
// holder's release reserves the key for the first reader; refused for the
// waiting writer, it hands the reservation to the next queued waiter and
// queues itself again with its old (earliest) score. When that next
// waiter was the second reader, it handed the reservation straight back,
// and so on: the writer never got the reservation, and (refused while the
// key was reserved for somebody else) waited until its registration
// expired, when the readers entered first. The writer must be granted
// before either reader. Every waiter is woken, never polls (wakeOnly).
func TestModes_WriterQueuedBehindReaders_GrantedFirst(t *testing.T) {
	t.Parallel()
	for _, d := range []struct {
		name string
		env  func(t *testing.T) modeEnv
	}{{"Standalone", standaloneEnv}, {"Cluster", clusterEnv}} {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			env := d.env(t)
			key := dlocktest.Key(t)
			queue := protoKeys.WaitersKey(key)
			x := mustTry(t, env.New(t), key, dlock.WithTTL(wakeTTL))
			ctx := wakeCtx(t)
			shared := append([]dlock.Option{dlock.WithShared()}, wakeOnly...)
			ra := acquireInBackground(ctx, env.New(t), key, shared...)
			waitQueued(t, env.Admin, queue, 1)
			rb := acquireInBackground(ctx, env.New(t), key, shared...)
			waitQueued(t, env.Admin, queue, 2)
			w := acquireInBackground(ctx, env.New(t), key, wakeOnly...)
			waitQueued(t, env.Admin, queue, 3) // its first attempt registered and queued it
			mustRelease(t, x)
			select {
			case g := <-w:
				if g.err != nil {
					t.Fatalf("writer: %v", g.err)
				}
				mustRelease(t, g.lk)
			case g := <-ra:
				t.Fatalf("reader A granted before the waiting writer: %+v", g)
			case g := <-rb:
				t.Fatalf("reader B granted before the waiting writer: %+v", g)
			case <-time.After(dlocktest.HangTimeout):
				t.Fatalf("hang: the waiting writer was not granted within %v of the release", dlocktest.HangTimeout)
			}
			for _, ch := range []<-chan acquired{ra, rb} {
				select {
				case g := <-ch:
					if g.err != nil {
						t.Fatalf("reader: %v", g.err)
					}
					defer mustRelease(t, g.lk)
				case <-time.After(dlocktest.HangTimeout):
					t.Fatal("hang: a reader was not granted after the writer released")
				}
			}
		})
	}
}

// TestModes_PermitRelease_WakesPermitWaiter: a semaphore of 2 fully held;
// a blocking exclusive request queued first, a blocking shared one next, a
// blocking permit request after them, none of which polls within the test
// (wakeOnly). A permit's release (another still held) woke (and dequeued)
// the first queued waiter only: the writer, who cannot use a permit; the
// permit waiter slept on with a permit free. The permit waiter must be
// woken, and the writer and the reader after the last permit's release.
func TestModes_PermitRelease_WakesPermitWaiter(t *testing.T) {
	t.Parallel()
	for _, d := range []struct {
		name string
		env  func(t *testing.T) modeEnv
	}{{"Standalone", standaloneEnv}, {"Cluster", clusterEnv}} {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			env := d.env(t)
			key := dlocktest.Key(t)
			queue := protoKeys.WaitersKey(key)
			p1 := mustTry(t, env.New(t), key, dlock.WithLimit(2), dlock.WithTTL(wakeTTL))
			p2 := mustTry(t, env.New(t), key, dlock.WithLimit(2), dlock.WithTTL(wakeTTL))
			ctx := wakeCtx(t)
			w := acquireInBackground(ctx, env.New(t), key, wakeOnly...)
			waitQueued(t, env.Admin, queue, 1)
			r := acquireInBackground(ctx, env.New(t), key, append([]dlock.Option{dlock.WithShared()}, wakeOnly...)...)
			waitQueued(t, env.Admin, queue, 2)
			p := acquireInBackground(ctx, env.New(t), key, append([]dlock.Option{dlock.WithLimit(2)}, wakeOnly...)...)
			waitQueued(t, env.Admin, queue, 3)
			mustRelease(t, p1)
			select {
			case g := <-p:
				if g.err != nil {
					t.Fatalf("permit waiter: %v", g.err)
				}
				mustRelease(t, g.lk)
			case g := <-w:
				t.Fatalf("writer granted while a permit is held: %+v", g)
			case g := <-r:
				t.Fatalf("reader granted while a permit is held: %+v", g)
			case <-time.After(dlocktest.HangTimeout):
				t.Fatal("hang: the released permit did not wake the permit waiter queued behind a writer and a reader")
			}
			mustRelease(t, p2)
			for i, ch := range []<-chan acquired{w, r} {
				select {
				case g := <-ch:
					if g.err != nil {
						t.Fatalf("waiter %d: %v", i, g.err)
					}
					mustRelease(t, g.lk)
				case <-time.After(dlocktest.HangTimeout):
					t.Fatalf("hang: waiter %d (writer, then reader) not granted after the last permit's release", i)
				}
			}
		})
	}
}

// TestModes_ExpiredGroup_KeepsWriterPreference: a group whose holders'
// leases all ended while its lock key still exists (Redis expires the
// key at the latest holder's end, by a clock read at another moment of
// the script than its TIME, so for up to a millisecond; here the key is
// made to outlive them) admitted a new reader although a writer was
// registered: the writer-preference check ran only for a group with live
// holders and for a free key, not for a group left with none. The
// writer's registration is written as a refused attempt writes it (a
// real writer retries when the reader's lease ends, and wins the race
// against this test's reader).
func TestModes_ExpiredGroup_KeepsWriterPreference(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	admin := newClient(t, srv)
	rl := redislock.New(newClient(t, srv))
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	const ttl = 2 * time.Second // a grant that takes a starved machine long still has validity left
	p := testserver.StartProxy(t, srv.Addr())
	pc := redis.NewClient(&redis.Options{Addr: p.Addr(), Password: srv.Password()})
	t.Cleanup(func() { pc.Close() })
	t.Cleanup(p.Heal)
	r1 := mustTry(t, redislock.New(pc), key, dlock.WithShared(), dlock.WithTTL(ttl), dlock.WithAutoRefresh(false))
	p.Cut() // r1 crashed: its lease ends on the server, unreleased
	lkey := rl.LockKey(key)
	now, err := admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.ZAdd(ctx, lkey+":wr", redis.Z{Score: float64(now.Add(time.Minute).UnixMilli()), Member: "writer"}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.PExpire(ctx, lkey, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	// Past the server-side end of r1's lease.
	waitHolderEnded(t, admin, key, r1.Owner())
	lk, err := rl.TryAcquire(ctx, key, dlock.WithShared())
	if err == nil {
		_ = lk.Release(context.Background())
		t.Fatal("a reader was admitted while a writer was registered (the group's holders had all expired)")
	}
	if !strings.Contains(err.Error(), "writer preference") {
		t.Fatalf("reader refused with %v, want the writer-preference refusal", err)
	}
	// The writer (no registration needed for an exclusive grant) gets it,
	// with a token above the reader's.
	w := mustTry(t, rl, key)
	if w.Token() <= r1.Token() {
		t.Fatalf("writer token %d not above the expired reader's %d", w.Token(), r1.Token())
	}
}

// TestModes_Semaphore_LimitAndLeasesHold: concurrent grants never exceed
// the limit; a permit whose acquire
// reply was lost is one holder, the lock's own; a limit unlike a crashed
// holder's is no mismatch once that holder's lease ended; a limited or
// shared request on a stalled link returns by its context's deadline.
func TestModes_Semaphore_LimitAndLeasesHold(t *testing.T) {
	t.Parallel()
	env := standaloneEnv(t)
	t.Run("ConcurrentGrants", func(t *testing.T) {
		key := dlocktest.Key(t)
		const limit, n = 3, 16
		type res struct {
			lk  *dlock.Lock
			err error
		}
		ch := make(chan res, n)
		start := make(chan struct{})
		for range n {
			l := env.New(t)
			go func() {
				<-start
				lk, err := l.TryAcquire(dlocktest.Context(t), key, dlock.WithLimit(limit))
				ch <- res{lk, err}
			}()
		}
		close(start)
		var got []*dlock.Lock
		for range n {
			r := <-ch
			if r.err == nil {
				got = append(got, r.lk)
			}
		}
		if len(got) != limit {
			t.Fatalf("%d permits granted concurrently, limit %d", len(got), limit)
		}
		infos, err := env.New(t).List(dlocktest.Context(t), key)
		if err != nil || len(infos) != 1 || infos[0].Limit != limit || len(infos[0].Holders) != limit || infos[0].Mode != dlock.Limited {
			t.Fatalf("List = %+v, %v; want one semaphore of %d with %d holders", infos, err, limit, limit)
		}
		for _, lk := range got {
			mustRelease(t, lk)
		}
	})
	t.Run("LostAcquireReply", func(t *testing.T) {
		l, link := env.Proxied(t)
		mustRelease(t, mustTry(t, l, dlocktest.Key(t), dlock.WithLimit(1))) // warm
		key := dlocktest.Key(t)
		link.LoseNextReply()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		lk, err := l.Acquire(ctx, key, dlock.WithLimit(2), dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatalf("limited Acquire with its reply lost: %v", err)
		}
		defer lk.Release(context.Background())
		other := mustTry(t, env.New(t), key, dlock.WithLimit(2)) // the second permit is free
		refused(t, env.New(t), key, dlock.WithLimit(2))
		mustRelease(t, other)
		infos, err := env.New(t).List(dlocktest.Context(t), key)
		if err != nil || len(infos) != 1 || len(infos[0].Holders) != 1 || infos[0].Holders[0].Owner != lk.Owner() {
			t.Fatalf("List = %+v, %v; want the lock's own permit alone", infos, err)
		}
	})
	t.Run("MismatchAgainstExpired", func(t *testing.T) {
		l, link := env.Proxied(t)
		key := dlocktest.Key(t)
		const ttl = 2 * time.Second // a grant that takes a starved machine long still has validity left
		crashed := mustTry(t, l, key, dlock.WithLimit(2), dlock.WithTTL(ttl), dlock.WithAutoRefresh(false))
		link.Cut()
		// Past the server-side end of the crashed permit's lease.
		waitHolderEnded(t, env.Admin, key, crashed.Owner())
		lk := mustTry(t, env.New(t), key, dlock.WithLimit(5))
		if lk.Token() <= crashed.Token() {
			t.Fatalf("token %d not above the expired permit's %d", lk.Token(), crashed.Token())
		}
		if _, err := env.New(t).TryAcquire(dlocktest.Context(t), key, dlock.WithLimit(2)); !errors.Is(err, dlock.ErrLimitMismatch) {
			t.Fatalf("limit 2 on the new semaphore of 5: %v, want ErrLimitMismatch", err)
		}
		mustRelease(t, lk)
	})
	t.Run("StalledLink", func(t *testing.T) {
		l, link := env.Proxied(t)
		key := dlocktest.Key(t)
		mustRelease(t, mustTry(t, l, key, dlock.WithShared())) // warm
		link.Stall()
		for _, opt := range []dlock.Option{dlock.WithShared(), dlock.WithLimit(3)} {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			done := make(chan error, 1)
			go func() {
				_, err := l.Acquire(ctx, key, opt)
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("granted over a stalled link")
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Acquire on a stalled link did not return by its deadline")
			}
			cancel()
		}
	})
}

// Symptom: with a writer registered that died waiting, the readers queued
// behind it handed the key's reservation back and forth, each woken at
// once by the other, one script per round trip until the registration
// expired. A reader that hands the reservation on is not queued again:
// one release causes one attempt per reader queued.
func TestModes_DeadWriterRegistered_ReadersPassTheReservationOnce(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	admin := newClient(t, srv)
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	x := mustTry(t, redislock.New(newClient(t, srv)), key)
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 2 {
		l := redislock.New(newClient(t, srv))
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A minute between polls: only wake-ups make attempts.
			if lk, err := l.Acquire(wctx, key, dlock.WithShared(), dlock.WithBackoff(dlock.ConstBackoff{Delay: time.Minute})); err == nil {
				_ = lk.Release(context.Background())
			}
		}()
	}
	defer func() { cancel(); wg.Wait() }()
	l0waiters(t, admin, key, 2)
	lkey := redislock.New(admin).LockKey(key)
	now, err := admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.ZAdd(ctx, lkey+":wr", redis.Z{Score: float64(now.Add(time.Minute).UnixMilli()), Member: "dead-writer"}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := x.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The release (release_fast.lua, then release.lua: waiters are
	// queued) and one attempt by each reader.
	for end := time.Now().Add(dlocktest.HangTimeout); evalCalls(t, admin) < 4; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("hang: %d scripts after the release, want 4", evalCalls(t, admin))
		}
	}
	time.Sleep(300 * time.Millisecond) // a hand-off each round trip would run hundreds meanwhile
	if n := evalCalls(t, admin); n > 4 {
		t.Errorf("%d scripts after one release, want 4: the readers handed the reservation back and forth", n)
	}
}
