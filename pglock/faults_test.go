// Faults: a link that stalls or loses a reply (testserver.Proxy), a
// server or a backend that is paused, stopped or restarted.

package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/background"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/pglock"
)

// An Acquire whose context ends while its statement waits, unread, on a
// stopped server backend is undone (its owner's tombstone written on
// another connection) before the statement runs, so the statement, run
// after the holder left, takes nothing: the key is free.
// Symptom: the late statement granted the key to an owner nobody held, for its whole TTL.
func TestAcquire_StatementRunAfterContextEndedTakesNothing(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("reads the server's socket queue from /proc/net/tcp")
	}
	pg := sharedPG(t)
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	holder, err := pglock.New(newPool(t, pg.DSN(""))).Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	// The waiter's attempts run one after the other on one connection of
	// its pool (which hands out the one used last), whose server backend
	// the test finds by the application name. A second connection is
	// left for the undo: pgx's close of the connection whose statement
	// was cut waits on the stopped backend.
	const app = "dlock_late_waiter"
	waiter := pglock.New(newPool(t, pg.DSN("")+"&pool_max_conns=2&application_name="+app), pglock.WithoutListen())
	var attempts atomic.Int32
	obs := dlock.ObserverFunc(func(e dlock.Event) {
		if e.Kind == dlock.EventAttempt {
			attempts.Add(1)
		}
	})
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(wctx, key, dlock.WithCallObserver(obs), dlock.WithBackoff(dlock.ConstBackoff{Delay: 20 * time.Millisecond}))
		done <- err
	}()
	waitFor(t, "the waiter's first attempt to be answered", func() bool { return attempts.Load() >= 2 })
	out, err := pg.Exec("", "SELECT pid, client_port FROM pg_stat_activity WHERE datname = current_database() AND application_name = '"+app+"' ORDER BY state_change DESC LIMIT 1")
	var pid, port int
	if _, serr := fmt.Sscanf(out, "%d|%d", &pid, &port); err != nil || serr != nil {
		t.Fatalf("the waiter's backend: %q, %v, %v", out, err, serr)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("stopping the waiter's backend: %v", err)
	}
	defer syscall.Kill(pid, syscall.SIGCONT)
	// The next attempt's statement reaches the stopped backend's socket.
	waitFor(t, "an attempt's statement to reach the stopped backend", func() bool { return recvQueued(t, pg.Port(), port) > 0 })
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Acquire succeeded while its statement waited on a stopped backend")
		}
		t.Logf("waiter: %v", err)
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: Acquire ignored its context")
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The undo writes the attempt's tombstone, a released holder row,
	// beside the one that the waiting writer's Leave writes. Without an
	// undo, the test goes on after the bound and finds the key taken.
	undone := func() bool {
		n, err := pg.Exec("", fmt.Sprintf("SELECT count(*) >= 2 FROM dlock_leases_holders WHERE key = '%s' AND released AND owner <> '%s'", escape(key), escape(holder.Owner())))
		return err == nil && n == "t"
	}
	for end := time.Now().Add(dlocktest.HangTimeout); !undone() && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// The backend runs the statement, finds its client gone and exits.
	waitFor(t, "the stopped backend to run its statement and exit", func() bool {
		n, err := pg.Exec("", fmt.Sprintf("SELECT count(*) FROM pg_stat_activity WHERE pid = %d", pid))
		return err == nil && n == "0"
	})
	fctx, fcancel := context.WithTimeout(context.Background(), dlocktest.HangTimeout)
	defer fcancel()
	lk, err := pglock.New(newPool(t, pg.DSN(""))).TryAcquire(fctx, key)
	if err != nil {
		t.Fatalf("the key after its holder left and the waiter's late statement ran: %v, want it free", err)
	}
	if err := lk.Release(fctx); err != nil {
		t.Fatal(err)
	}
}

// waitFor waits until cond holds, failing the test as a hang after
// dlocktest.HangTimeout.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(dlocktest.HangTimeout)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("hang: waited %v for %s", dlocktest.HangTimeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// recvQueued is the number of bytes received and not yet read on the
// loopback TCP socket from local port lport to remote port rport, from
// /proc/net/tcp (0 if there is none).
func recvQueued(t *testing.T, lport, rport int) int {
	t.Helper()
	data, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n")[1:] {
		// "sl local_address rem_address st tx_queue:rx_queue ...",
		// addresses and queues in hex.
		f := strings.Fields(line)
		if len(f) < 5 || hexPort(f[1]) != lport || hexPort(f[2]) != rport {
			continue
		}
		_, rx, _ := strings.Cut(f[4], ":")
		n, _ := strconv.ParseInt(rx, 16, 64)
		return int(n)
	}
	return 0
}

// hexPort is the port of a /proc/net/tcp address "ADDR:PORT" (hex).
func hexPort(addr string) int {
	_, p, _ := strings.Cut(addr, ":")
	n, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return -1
	}
	return int(n)
}

// An attempt abandoned on a stalled link is undone by Abort, but the
// attempt's statement is still on its way: held by the network, it reaches
// PostgreSQL after the Abort (here: Abort through a healthy connection
// while the attempt waits in the stalled proxy, which delivers it on
// Heal). The late statement grants the aborted owner nothing, in every
// mode: the key is free for a writer at once.
// Symptom: the key (a reader's share, a limit-1 semaphore's permit, the exclusive lease) stayed taken, by nobody, for a full TTL after the link healed.
func TestAbort_LateAttemptStatementTakesNothing(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	proxy := testserver.StartProxy(t, pg.Addr())
	// The unnamed statement: the statement stalled is the attempt itself,
	// never a preparation before it.
	faulty := pglock.New(newPool(t, pg.ViaProxy(proxy.Addr())+"&default_query_exec_mode=exec"), pglock.WithoutListen())
	healthy := pglock.New(newPool(t, pg.DSN("")))
	ctx := dlocktest.Context(t)
	for _, mode := range []driver.Mode{driver.Shared, driver.Limited, driver.Exclusive} {
		key := dlocktest.Key(t)
		warm := mustLock(t, faulty, dlocktest.Key(t), dlock.WithTTL(time.Minute))
		mustRelease(t, warm)
		req := &driver.Request{Key: key, Owner: dlock.NewOwner(), TTL: time.Minute, Metadata: map[string]string{}, Mode: mode, Limit: 1}
		proxy.Stall()
		actx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		_, _, err := pglock.TryRaw(actx, faulty, req)
		cancel()
		if err == nil {
			t.Fatalf("%s: granted through a stalled link", mode)
		}
		if err := pglock.Abort(ctx, healthy, req); err != nil {
			t.Fatalf("%s: abort: %v", mode, err)
		}
		proxy.Heal()
		time.Sleep(500 * time.Millisecond) // the held statement is delivered
		n, err := pg.Exec("", "SELECT (SELECT count(*) FROM dlock_leases_holders WHERE key = '"+escape(key)+"' AND NOT released AND expires_at > clock_timestamp()) + (SELECT count(*) FROM dlock_leases WHERE key = '"+escape(key)+"' AND expires_at > clock_timestamp())")
		if err != nil {
			t.Fatal(err)
		}
		if n != "0" {
			t.Errorf("%s: the aborted attempt holds the key (%s live holder rows) after its late statement landed", mode, n)
		}
		w, err := healthy.TryAcquire(ctx, key)
		if err != nil {
			t.Errorf("%s: writer after the aborted attempt: %v", mode, err)
			continue
		}
		mustRelease(t, w)
	}
}

// A waiting writer's registration statement abandoned on a stalled link
// (its attempt's context ended) reaches PostgreSQL after the writer left
// (the engine's Leave, on another connection, landed first). It does not
// register the writer again: a reader gets the key at once.
// Symptom: the writer that had given up kept every reader out for the registration's full TTL after the link healed.
func TestLeave_LateRegistrationRegistersNothing(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	proxy := testserver.StartProxy(t, pg.Addr())
	// The unnamed statement: the statement stalled is the attempt itself,
	// never a preparation before it.
	faulty := pglock.New(newPool(t, pg.ViaProxy(proxy.Addr())+"&default_query_exec_mode=exec"), pglock.WithoutListen())
	healthy := pglock.New(newPool(t, pg.DSN("")))
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	warm := mustLock(t, faulty, dlocktest.Key(t), dlock.WithTTL(time.Minute))
	mustRelease(t, warm)
	req := &driver.Request{Key: key, Owner: dlock.NewOwner(), TTL: time.Minute, Metadata: map[string]string{}, Waiter: dlock.NewOwner()}
	pglock.Register(ctx, healthy, req) // the writer waits
	proxy.Stall()
	rctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	pglock.Register(rctx, faulty, req) // its renewal, held by the link
	cancel()
	if err := pglock.Leave(ctx, healthy, key, req.Waiter); err != nil { // it gives up
		t.Fatal(err)
	}
	proxy.Heal()
	time.Sleep(500 * time.Millisecond) // the held statement is delivered
	r, err := healthy.TryAcquire(ctx, key, dlock.WithShared())
	if err != nil {
		t.Fatalf("reader after the writer left: %v (its late registration keeps readers out)", err)
	}
	mustRelease(t, r)
}

// The reply to a shared acquisition is lost (it took effect): the client
// gets the lock or an error that is not ErrNotAcquired, and no reader's
// row is left behind to keep a writer out for its minute-long TTL.
func TestLostReplyOnSharedAcquire(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	proxy := testserver.StartProxy(t, pg.Addr())
	l := preparedLocker(t, pg.ViaProxy(proxy.Addr()))
	for _, opt := range []dlock.Option{dlock.WithShared(), dlock.WithLimit(2)} {
		key := dlocktest.Key(t)
		warm := mustLock(t, l, dlocktest.Key(t), opt, dlock.WithTTL(time.Minute))
		mustRelease(t, warm)
		proxy.LoseNextReply()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		lk, err := l.Acquire(ctx, key, opt, dlock.WithTTL(time.Minute))
		cancel()
		proxy.Heal()
		if err == nil {
			t.Logf("acquired despite the lost reply (token %d)", lk.Token())
			mustRelease(t, lk)
		} else {
			t.Logf("acquire with a lost reply: %v", err)
			if errors.Is(err, dlock.ErrNotAcquired) {
				t.Fatalf("a lost reply reported as a held key: %v", err)
			}
		}
		w := mustLock(t, pglock.New(newPool(t, pg.DSN(""))), key, dlock.WithWait(dlocktest.HangTimeout))
		mustRelease(t, w)
	}
}

// A release whose statement is prepared on the connection first, and
// whose preparation's reply is lost, fails as an outage without having
// run; its retry releases, and the key is free.
// Symptom: with prepared statements, a lost reply could hit the preparation instead of the release.
func TestRelease_PreparationReplyLost_RetryReleases(t *testing.T) {
	t.Parallel()
	proxy, faulty, other := preparedBehindProxy(t)
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	lk := mustLock(t, faulty, key, dlock.WithTTL(time.Minute))
	proxy.LoseNextReply() // the release statement's first use: its preparation
	err := lk.Release(ctx)
	proxy.Heal()
	if err == nil {
		t.Fatal("release succeeded though the reply to its preparation was lost")
	}
	if !errors.Is(err, dlock.ErrUnavailable) {
		t.Errorf("release with a lost preparation reply: %v, want an error wrapping dlock.ErrUnavailable", err)
	}
	if _, err := other.TryAcquire(ctx, key); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("the key after a release that never ran: %v, want it still held", err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatalf("retried release: %v", err)
	}
	mustRelease(t, mustLock(t, other, key))
}

// A shared or limited release whose reply is lost fails, leaves the row
// released on the server (the permit is free at once, not a TTL later),
// and its retry succeeds without freeing anything else; a permit whose
// renewal reply is lost is never doubled.
func TestSharedRelease_LostReplyFreesAtOnce(t *testing.T) {
	t.Parallel()
	proxy, faulty, other := preparedBehindProxy(t)
	ctx := dlocktest.Context(t)
	for _, opt := range []dlock.Option{dlock.WithShared(), dlock.WithLimit(1)} {
		key := dlocktest.Key(t)
		warm := mustLock(t, faulty, dlocktest.Key(t), opt, dlock.WithTTL(time.Minute))
		if err := warm.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		mustRelease(t, warm)
		lk := mustLock(t, faulty, key, opt, dlock.WithTTL(time.Minute))
		proxy.LoseNextReply()
		err := lk.Release(ctx)
		proxy.Heal()
		t.Logf("release with a lost reply: %v", err)
		// Free at once: an exclusive TryAcquire gets it.
		w, err2 := other.TryAcquire(ctx, key)
		if err2 != nil {
			t.Fatalf("writer after a release whose reply was lost: %v (release: %v)", err2, err)
		}
		if err != nil {
			if err := lk.Release(ctx); err != nil && !errors.Is(err, dlock.ErrNotHeld) {
				t.Fatalf("retried release: %v", err)
			}
		}
		mustRelease(t, w)
	}
	// Renewal reply lost: the permit holder keeps or loses its lock, but
	// a second permit is never granted while it holds.
	key := dlocktest.Key(t)
	lk := mustLock(t, faulty, key, dlock.WithLimit(1), dlock.WithTTL(400*time.Millisecond))
	proxy.LoseNextReply()
	end := time.Now().Add(time.Second)
	for time.Now().Before(end) {
		p, err := other.TryAcquire(ctx, key, dlock.WithLimit(1))
		if err == nil {
			if time.Now().Before(lk.Deadline()) {
				t.Fatalf("second permit (token %d) while the first (token %d) is valid", p.Token(), lk.Token())
			}
			mustRelease(t, p)
			break
		}
		if !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	proxy.Heal()
	_ = lk.Release(ctx)
}

// While the server is stopped (SIGSTOP) or the waiter's link stalls, every
// waiter's Acquire returns by its context, and once the server answers
// again, the LISTEN loops end after their linger.
//
// Not parallel: it waits for all of dlock's background work, which is
// process-wide, to end.
func TestAcquire_WaitersReturnByContextOnHungServer(t *testing.T) {
	pg := ownPG(t)
	proxy := testserver.StartProxy(t, pg.Addr())
	viaProxy := pg.ViaProxy(proxy.Addr())
	for _, tc := range []struct {
		name         string
		hang, unhang func()
	}{
		{"sigstop", pg.Pause, pg.Resume},
		{"stall", proxy.Stall, proxy.Heal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := dlocktest.Key(t)
			ctx := dlocktest.Context(t)
			holder := pglock.New(newPool(t, pg.DSN("")))
			hl, err := holder.Acquire(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			defer hl.Release(context.Background())
			var ws []*pglock.Locker
			for i := 0; i < 4; i++ {
				ws = append(ws, pglock.New(newPool(t, viaProxy)))
			}
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i, w := range ws {
				wg.Add(1)
				go func() {
					defer wg.Done()
					// Waiting (and listening) before the hang, or
					// starting during it.
					if i%2 == 1 {
						<-start
					}
					wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
					defer cancel()
					t0 := time.Now()
					lk, err := w.Acquire(wctx, key, dlock.WithBackoff(dlock.ConstBackoff{Delay: 50 * time.Millisecond}))
					if err == nil {
						lk.Release(context.Background())
						t.Errorf("waiter %d acquired a held key", i)
						return
					}
					t.Logf("waiter %d: %v after %v", i, err, time.Since(t0))
					if d := time.Since(t0); d > 2*time.Second+dlocktest.HangTimeout/3 {
						t.Errorf("waiter %d: Acquire returned %v after its 2s context: %v", i, d, err)
					}
				}()
			}
			waitListening(t, pg)
			tc.hang()
			close(start)
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(dlocktest.HangTimeout):
				tc.unhang()
				t.Fatal("hang: a waiter's Acquire ignored its context")
			}
			tc.unhang()
		})
	}
	if !background.Wait(dlocktest.HangTimeout) {
		t.Fatal("LISTEN loops still run after the server came back and the waiters left")
	}
}

// The server process of a waiting Locker's LISTEN connection stops
// answering (SIGSTOP on that backend alone; the link and the rest of the
// server are fine): after its silence the connection is pinged,
// abandoned, and a new one LISTENs, so the waiter, whose backoff is a
// minute, is still woken by the release.
func TestWatch_HungListenBackendReplaced(t *testing.T) {
	t.Parallel()
	pg := ownPG(t)
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	holder := pglock.New(newPool(t, pg.DSN("")))
	waiter := pglock.New(newPool(t, pg.DSN("")), pglock.WithRequestTimeout(time.Second))
	hl, err := holder.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(context.Background(), 2*dlocktest.HangTimeout)
	defer cancel()
	got := acquireLater(wctx, waiter, key, time.Minute)
	waitListening(t, pg)
	first := listenPIDs(t, pg)
	var pid int
	if _, err := fmt.Sscan(first, &pid); err != nil {
		t.Fatalf("LISTEN backends %q: %v", first, err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Skipf("cannot stop the server's backend: %v", err)
	}
	defer syscall.Kill(pid, syscall.SIGCONT)
	end := time.Now().Add(2 * dlocktest.HangTimeout)
	for {
		// The new one is listed next to the stopped one, which cannot
		// exit.
		if p := listenPIDs(t, pg); p != "" && p != first {
			break
		}
		if time.Now().After(end) {
			t.Fatal("no new LISTEN connection while the old one's backend is stopped")
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // its wake-up and retry have run
	if err := hl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("the waiter was not woken by the release")
	}
}

// A lingering LISTEN connection whose link stalls is still closed, and its
// goroutine ends, within a bounded time after the last waiter left (the
// linger, then a close bounded by a second).
//
// Not parallel: it waits for all of dlock's background work, which is
// process-wide, to end.
func TestListenLingerEndsOnStalledLink(t *testing.T) {
	pg := ownPG(t)
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	p := testserver.StartProxy(t, pg.Addr())
	holder := pglock.New(newPool(t, pg.DSN("")))
	waiter := pglock.New(newPool(t, pg.ViaProxy(p.Addr())), pglock.WithRequestTimeout(500*time.Millisecond))
	hl, err := holder.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	got := acquireLater(ctx, waiter, key, time.Minute)
	end := time.Now().Add(dlocktest.HangTimeout)
	for listenPIDs(t, pg) == "" {
		if time.Now().After(end) {
			t.Fatal("hang: the waiter never listened")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // its retry after subscribing has run
	if err := hl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("the waiter was not woken by the release")
	}
	// The waiter's LISTEN connection lingers; its link now stalls.
	p.Stall()
	defer p.Heal()
	if !background.Wait(5 * time.Second) {
		t.Fatal("the lingering LISTEN loop still runs 5s after its last waiter left, on a stalled link")
	}
}

// PostgreSQL stops behind PgBouncer: PgBouncer, still up, turns the
// statements away with a connection exception (SQLSTATE 08P01, "server
// login has been failing"), which a Release or TryAcquire reports
// wrapped in ErrUnavailable.
// Symptom: a Release, or a TryAcquire, failed with that bare error rather than ErrUnavailable.
func TestRelease_Unavailable_PostgresDownBehindPgBouncer(t *testing.T) {
	t.Parallel()
	pg := ownPG(t)
	pb := bouncerFor(t, pg)
	l := pglock.New(newPool(t, pb.DSN("")))
	// PgBouncer stops before the pool closes (cleanups run last first):
	// with PostgreSQL down it keeps a closed client connection open, and
	// pgx's Close waits 15 s for each.
	t.Cleanup(pb.Stop)
	lk, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t), dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	pg.Stop()
	// The first statement makes PgBouncer find PostgreSQL down; it may
	// hold it until the context ends, an outage either way.
	for _, what := range []string{"first TryAcquire", "TryAcquire"} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := l.TryAcquire(ctx, dlocktest.Key(t))
		cancel()
		t.Logf("%s with PostgreSQL down: %v", what, err)
		if !errors.Is(err, dlock.ErrUnavailable) {
			t.Fatalf("%s with PostgreSQL down behind PgBouncer: %v, want ErrUnavailable", what, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err = lk.Release(ctx)
	t.Logf("Release with PostgreSQL down: %v", err)
	var pe *pgconn.PgError
	if !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("Release with PostgreSQL down behind PgBouncer: %v, want ErrUnavailable", err)
	}
	if errors.As(err, &pe) && !strings.HasPrefix(pe.Code, "08") {
		t.Fatalf("Release: PgBouncer's error %v is not a connection exception", pe)
	}
}

// Every call on a lock held through a PgBouncer that stops answering
// returns by its context's deadline wrapping dlock.ErrUnavailable and the
// deadline.
// Symptom: Refresh returned a bare deadline error.
func TestLockCalls_UnavailableByDeadline_PgBouncerStalled(t *testing.T) {
	t.Parallel()
	pb := bouncerFor(t, sharedPG(t))
	p := testserver.StartProxy(t, pb.Addr())
	l := pglock.New(newPool(t, strings.Replace(pb.DSN(""), pb.Addr(), p.Addr(), 1)))
	lk, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t), dlock.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	p.Stall()
	for _, c := range []struct {
		what string
		fn   func(context.Context) error
	}{{"Refresh", lk.Refresh}, {"Release", lk.Release}} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		err := c.fn(ctx)
		cancel()
		if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s through a stalled PgBouncer = %v, want ErrUnavailable and DeadlineExceeded", c.what, err)
		}
	}
	p.Heal()
}

// Tokens keep increasing across a server crash and restart.
func TestRestartKeepsTokens(t *testing.T) {
	t.Parallel()
	pg := ownPG(t)
	key := dlocktest.Key(t)
	l := pglock.New(newPool(t, pg.DSN("")))
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	before := lk.Token()
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	pg.Restart()
	l2 := pglock.New(newPool(t, pg.DSN("")))
	lk2, err := l2.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	defer lk2.Release(context.Background())
	if lk2.Token() <= before {
		t.Fatalf("token %d after a restart, %d before", lk2.Token(), before)
	}
}

// preparedLocker is a Locker on a pool of one connection to dsn, which
// runs its statements as prepared statements (its pool check done), so a
// statement used once before is one round trip: a lost reply is then the
// reply to its execution, not to its preparation.
func preparedLocker(t *testing.T, dsn string, opts ...pglock.Option) *pglock.Locker {
	t.Helper()
	l := pglock.New(newPool(t, dsn+"&pool_max_conns=1"), opts...)
	if m := pglock.CheckStatementMode(l); m != pgx.QueryExecModeCacheStatement {
		t.Fatalf("statement mode %v, want the statement cache", m)
	}
	return l
}

// preparedBehindProxy returns a fault proxy in front of the shared
// server, a Locker through it with its statements prepared (so that a
// lost reply is its statement's, not a preparation's), and a Locker on
// the server directly.
func preparedBehindProxy(t *testing.T) (*testserver.Proxy, *pglock.Locker, *pglock.Locker) {
	pg := sharedPG(t)
	proxy := testserver.StartProxy(t, pg.Addr())
	faulty := preparedLocker(t, pg.ViaProxy(proxy.Addr()),
		pglock.WithRequestTimeout(2*time.Second), pglock.WithoutListen())
	return proxy, faulty, pglock.New(newPool(t, pg.DSN("")))
}
