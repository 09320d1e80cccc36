package redislock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// modeEnv is a deployment for the mode tests: standalone or Cluster.
type modeEnv struct {
	// New returns a Locker on a default client of its own.
	New func(t testing.TB) *redislock.Locker
	// Proxied returns a Locker whose every connection goes through fault
	// proxies, and the proxies.
	Proxied func(t testing.TB) (*redislock.Locker, dlocktest.Link)
}

func standaloneEnv(t *testing.T) modeEnv {
	srv := testserver.StartRedis(t)
	return modeEnv{
		New: func(t testing.TB) *redislock.Locker { return redislock.New(newClient(t, srv)) },
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
		New: func(t testing.TB) *redislock.Locker { return redislock.New(tc.client(t, nil)) },
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
	for _, d := range []struct {
		name string
		env  func(t *testing.T) modeEnv
	}{{"Standalone", standaloneEnv}, {"Cluster", clusterEnv}} {
		t.Run(d.name, func(t *testing.T) {
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
				t.Run(tc.name, func(t *testing.T) { tc.f(t, env) })
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
	eventually(t, 5*time.Second, "the writer's registration", func() bool {
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
// polling: their backoff is longer than the test's bound.
func testReadersFollowWriter(t *testing.T, env modeEnv) {
	rl, wl := env.New(t), env.New(t)
	key := dlocktest.Key(t)
	r1 := mustTry(t, rl, key, dlock.WithShared())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	slow := dlock.WithBackoff(dlock.ExpBackoff{Min: 20 * time.Second, Max: 20 * time.Second})
	got := acquireInBackground(ctx, wl, key, slow)
	waitRegistered(t, rl, key)
	var readers []<-chan acquired
	for range 3 {
		readers = append(readers, acquireInBackground(ctx, env.New(t), key, dlock.WithShared(), slow))
	}
	time.Sleep(300 * time.Millisecond) // their first attempts queued them
	mustRelease(t, r1)
	var w acquired
	select {
	case w = <-got:
		if w.err != nil {
			t.Fatalf("writer: %v", w.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the last reader's release did not wake the writer")
	}
	mustRelease(t, w.lk)
	timeout := time.After(5 * time.Second)
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
	eventually(t, 5*time.Second, "a reader after the writer left", func() bool {
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
// its last attempt, and no longer.
func testDeadWriterExpires(t *testing.T, env modeEnv) {
	rl := env.New(t)
	wl, link := env.Proxied(t)
	key := dlocktest.Key(t)
	r1 := mustTry(t, rl, key, dlock.WithShared())
	const ttl = time.Second
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := acquireInBackground(ctx, wl, key, dlock.WithTTL(ttl))
	waitRegistered(t, rl, key)
	link.Cut()
	cut := time.Now()
	cancel()
	<-got
	refused(t, rl, key, dlock.WithShared())
	eventually(t, ttl+3*time.Second, "a reader after the dead writer's registration expired", func() bool {
		lk, err := rl.TryAcquire(dlocktest.Context(t), key, dlock.WithShared())
		if err != nil {
			return false
		}
		_ = lk.Release(dlocktest.Context(t))
		return true
	})
	if d := time.Since(cut); d > ttl+2*time.Second {
		t.Errorf("readers kept out %s after the writer died, TTL %s", d, ttl)
	}
	mustRelease(t, r1)
}

// A crashed reader (its lease left to expire) frees its share at its own
// expiry: another reader keeps its lease, and a waiting writer gets the
// key once the live reader leaves, not later than the crashed one's TTL.
func testCrashedReader(t *testing.T, env modeEnv) {
	a, b, wl := env.New(t), env.New(t), env.New(t)
	key := dlocktest.Key(t)
	const ttl = 500 * time.Millisecond
	crashed := mustTry(t, a, key, dlock.WithShared(), dlock.WithTTL(ttl), dlock.WithAutoRefresh(false))
	live := mustTry(t, b, key, dlock.WithShared(), dlock.WithTTL(ttl))
	<-crashed.Lost()
	time.Sleep(ttl) // past the server-side expiry of crashed's lease
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
	granted := time.Now()
	crashed = mustTry(t, a, key, dlock.WithShared(), dlock.WithTTL(ttl), dlock.WithAutoRefresh(false))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := wl.Acquire(ctx, key, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("writer behind a crashed reader: %v", err)
	}
	if d := time.Since(granted); d > ttl+3*time.Second {
		t.Errorf("writer waited %s behind a crashed reader with TTL %s", d, ttl)
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
	const ttl = 500 * time.Millisecond
	crashed := mustTry(t, l, key, dlock.WithLimit(1), dlock.WithTTL(ttl), dlock.WithAutoRefresh(false))
	refused(t, l, key, dlock.WithLimit(1))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := env.New(t).Acquire(ctx, key, dlock.WithLimit(1))
	if err != nil {
		t.Fatalf("permit behind a crashed holder: %v", err)
	}
	if p.Token() <= crashed.Token() {
		t.Fatalf("token %d not above the crashed holder's %d", p.Token(), crashed.Token())
	}
	mustRelease(t, p)
}

// A released permit wakes a waiter for it (long before its backoff).
func testPermitWakesWaiter(t *testing.T, env modeEnv) {
	key := dlocktest.Key(t)
	p1 := mustTry(t, env.New(t), key, dlock.WithLimit(2), dlock.WithTTL(time.Minute))
	p2 := mustTry(t, env.New(t), key, dlock.WithLimit(2), dlock.WithTTL(time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// A backoff of 10s: only the release's wake-up brings the waiter in
	// within the test's bound.
	slow := dlock.WithBackoff(dlock.ExpBackoff{Min: 10 * time.Second, Max: 10 * time.Second})
	got := acquireInBackground(ctx, env.New(t), key, dlock.WithLimit(2), slow)
	time.Sleep(300 * time.Millisecond) // the waiter's first attempt queued it
	mustRelease(t, p1)
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("permit waiter: %v", r.err)
		}
		mustRelease(t, r.lk)
	case <-time.After(5 * time.Second):
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
	eventually(t, 5*time.Second, "one holder, the lock's own", func() bool {
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
