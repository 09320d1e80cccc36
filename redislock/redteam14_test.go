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

// TestRedTeam14_ReadersPingPongStarveWriter: two blocking readers queued
// ahead of a blocking writer behind an exclusive holder. The holder's
// release reserves the key for the first reader; refused for the waiting
// writer, it hands the reservation to the next queued waiter and queues
// itself again with its old (earliest) score. When that next waiter is
// the second reader, it hands the reservation straight back, and so on:
// the writer never got the reservation, and (refused while the key was
// reserved for somebody else) waited until its registration expired,
// when the readers entered first. The writer must be granted before
// either reader.
func TestRedTeam14_ReadersPingPongStarveWriter(t *testing.T) {
	for _, d := range []struct {
		name string
		env  func(t *testing.T) modeEnv
	}{{"Standalone", standaloneEnv}, {"Cluster", clusterEnv}} {
		t.Run(d.name, func(t *testing.T) {
			env := d.env(t)
			key := dlocktest.Key(t)
			x := mustTry(t, env.New(t), key)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			slow := dlock.WithBackoff(dlock.ExpBackoff{Min: 20 * time.Second, Max: 20 * time.Second})
			ttl := dlock.WithTTL(10 * time.Second)
			ra := acquireInBackground(ctx, env.New(t), key, dlock.WithShared(), slow, ttl)
			time.Sleep(200 * time.Millisecond)
			rb := acquireInBackground(ctx, env.New(t), key, dlock.WithShared(), slow, ttl)
			time.Sleep(200 * time.Millisecond)
			wl := env.New(t)
			w := acquireInBackground(ctx, wl, key, slow, ttl)
			time.Sleep(300 * time.Millisecond) // its first attempt registered and queued it
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
			case <-time.After(5 * time.Second):
				t.Fatal("the waiting writer was not granted within 5s of the release")
			}
			for _, ch := range []<-chan acquired{ra, rb} {
				select {
				case g := <-ch:
					if g.err != nil {
						t.Fatalf("reader: %v", g.err)
					}
					defer mustRelease(t, g.lk)
				case <-time.After(5 * time.Second):
					t.Fatal("a reader was not granted after the writer released")
				}
			}
		})
	}
}

// TestRedTeam14_PermitWakeGoesToWriter: a semaphore of 2 fully held; a
// blocking exclusive request queued first, a blocking shared one next, a
// blocking permit request after them, all with a backoff far beyond the
// test's bound. A permit's release (another still held) woke (and
// dequeued) the first queued waiter only: the writer, who cannot use a
// permit; the permit waiter slept on with a permit free.
func TestRedTeam14_PermitWakeGoesToWriter(t *testing.T) {
	for _, d := range []struct {
		name string
		env  func(t *testing.T) modeEnv
	}{{"Standalone", standaloneEnv}, {"Cluster", clusterEnv}} {
		t.Run(d.name, func(t *testing.T) {
			env := d.env(t)
			key := dlocktest.Key(t)
			p1 := mustTry(t, env.New(t), key, dlock.WithLimit(2), dlock.WithTTL(time.Minute))
			p2 := mustTry(t, env.New(t), key, dlock.WithLimit(2), dlock.WithTTL(time.Minute))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			slow := dlock.WithBackoff(dlock.ExpBackoff{Min: 20 * time.Second, Max: 20 * time.Second})
			ttl := dlock.WithTTL(time.Minute)
			w := acquireInBackground(ctx, env.New(t), key, slow, ttl)
			time.Sleep(200 * time.Millisecond)
			r := acquireInBackground(ctx, env.New(t), key, dlock.WithShared(), slow, ttl)
			time.Sleep(200 * time.Millisecond)
			p := acquireInBackground(ctx, env.New(t), key, dlock.WithLimit(2), slow, ttl)
			time.Sleep(300 * time.Millisecond) // both queued
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
			case <-time.After(5 * time.Second):
				t.Fatal("the released permit did not wake the permit waiter queued behind a writer and a reader")
			}
			mustRelease(t, p2)
			for i, ch := range []<-chan acquired{w, r} {
				select {
				case g := <-ch:
					if g.err != nil {
						t.Fatalf("waiter %d: %v", i, g.err)
					}
					mustRelease(t, g.lk)
				case <-time.After(5 * time.Second):
					t.Fatalf("waiter %d (writer, then reader) not granted after the last permit's release", i)
				}
			}
		})
	}
}

// TestRedTeam14_ExpiredGroupSkipsWriterPreference: a group whose holders'
// leases all ended while its lock key still exists (Redis expires the
// key at the latest holder's end, by a clock read at another moment of
// the script than its TIME, so for up to a millisecond; here the key is
// made to outlive them) admitted a new reader although a writer was
// registered: the writer-preference check ran only for a group with live
// holders and for a free key, not for a group left with none. The
// writer's registration is written as a refused attempt writes it (a
// real writer retries when the reader's lease ends, and wins the race
// against this test's reader).
func TestRedTeam14_ExpiredGroupSkipsWriterPreference(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin := newClient(t, srv)
	rl := redislock.New(newClient(t, srv))
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	const ttl = 300 * time.Millisecond
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
	<-r1.Lost()
	time.Sleep(2 * ttl) // past the server-side end of r1's lease
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

// TestRedTeam14_SemaphoreAttacksHeld: attacks on the semaphore that held
// up: concurrent grants never exceed the limit; a permit whose acquire
// reply was lost is one holder, the lock's own; a limit unlike a crashed
// holder's is no mismatch once that holder's lease ended; a limited or
// shared request on a stalled link returns by its context's deadline.
func TestRedTeam14_SemaphoreAttacksHeld(t *testing.T) {
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
		const ttl = 300 * time.Millisecond
		crashed := mustTry(t, l, key, dlock.WithLimit(2), dlock.WithTTL(ttl), dlock.WithAutoRefresh(false))
		link.Cut()
		time.Sleep(3 * ttl)
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

// TestRedTeam14_LostPermitReleaseReply (held up): the last permit's
// release whose reply is lost succeeds on retry (its receipt), leaves
// the key free for another mode, and the next token is above it.
func TestRedTeam14_LostPermitReleaseReply(t *testing.T) {
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
