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

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/pglock"
)

// An attempt that finds the key held is a read: it does not lock the
// holder's row (the row's xmax stays 0), draws no token (the sequence
// does not move) and reports the holder.
func TestFailedAttemptIsARead(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	holder, err := pglock.New(newPool(t, pg.DSN(""))).Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx)
	query := func(sql string) string {
		t.Helper()
		out, err := pg.Exec("", sql)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	seq := query("SELECT last_value FROM dlock_leases_token_seq")
	other := pglock.New(newPool(t, pg.DSN("")))
	for i := 0; i < 10; i++ {
		_, err := other.TryAcquire(ctx, key)
		var na *dlock.NotAcquiredError
		if !errors.As(err, &na) {
			t.Fatalf("attempt %d: %v, want the key held", i, err)
		}
		if len(na.Holders) != 1 || na.Holders[0].Token != holder.Token() {
			t.Fatalf("attempt %d: holders %+v, want the holder with token %d", i, na.Holders, holder.Token())
		}
	}
	if got := query("SELECT last_value FROM dlock_leases_token_seq"); got != seq {
		t.Errorf("the token sequence moved from %s to %s: failed attempts drew tokens", seq, got)
	}
	if got := query("SELECT xmax FROM dlock_leases WHERE key = '" + escape(key) + "'"); got != "0" {
		t.Errorf("the holder's row has xmax %s: a failed attempt locked it", got)
	}
}

// An Acquire whose context ended while its statement waited, unread, on a
// stalled server backend: when the backend ran the statement later, after
// the holder had left, it granted the key to an owner nobody held, for
// its whole TTL. The attempt is undone (its owner's tombstone written on
// another connection) before the statement runs, so it takes nothing.
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

// A writer's TryAcquire was refused, naming no holder, right after the
// last reader released: a renewal of that reader, in flight across the
// release, bumped the key row's gen between the writer's snapshot and its
// upsert. Once: the plain retry takes the key; three times: the read
// under the row's lock does.
func TestTryAcquire_TakesAFreeKeyWhoseRowChangedUnderIt(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	for _, changes := range []int{1, 3} {
		t.Run(fmt.Sprint(changes), func(t *testing.T) {
			key := dlocktest.Key(t)
			reader := mustLock(t, pglock.New(newPool(t, pg.DSN(""))), key, dlock.WithShared())
			mustRelease(t, reader)
			tr, bumps := changeRowUnder(newPool(t, pg.DSN("")), key, changes, func(sql string, inTx bool) bool {
				// An attempt's first statement: the one-statement form
				// or the lock of its transaction.
				return strings.Contains(sql, "FOR UPDATE") || (!inTx && strings.Contains(sql, "taken AS"))
			})
			l := pglock.New(tracedPool(t, pg.DSN(""), tr))
			warm := mustLock(t, l, key+"-warm") // the schema exists: no migration statements traced
			mustRelease(t, warm)

			tr.on.Store(true)
			lk, err := l.TryAcquire(dlocktest.Context(t), key)
			tr.on.Store(false)
			if err != nil {
				t.Fatalf("TryAcquire of a free key whose row changed under the attempt %d times: %v", changes, err)
			}
			defer mustRelease(t, lk)
			if lk.Token() <= reader.Token() {
				t.Errorf("writer's token %d, not above the reader's %d", lk.Token(), reader.Token())
			}
			wantChanges(t, tr, bumps, changes)
		})
	}
}

// A contender that stalled inside the transaction holding the key row's
// lock (a paused process, a cut link) kept the key, and every renewal of
// its holder, waiting until its connection died: the server ends such a
// transaction after the request timeout.
func TestLockedAttempt_StalledClientLosesTheRowLock(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	key := dlocktest.Key(t)
	first := mustLock(t, pglock.New(newPool(t, pg.DSN(""))), key)
	mustRelease(t, first)
	// The contender's two one-statement attempts race a change of the
	// row; its third reads holding the row's lock, and stalls there.
	changes, bumps := changeRowUnder(newPool(t, pg.DSN("")), key, 2, func(sql string, inTx bool) bool {
		return !inTx && strings.Contains(sql, "taken AS")
	})
	stalled, unstall := make(chan struct{}), make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(unstall) })
	tr := &churnTracer{onStart: func(ctx context.Context, sql string, inTx bool) {
		changes.onStart(ctx, sql, inTx) // tr.on switches both
		if inTx && strings.Contains(sql, "taken AS") {
			close(stalled)
			<-unstall
		}
	}}
	// The server ends the contender's transaction once it has been idle
	// for this; the other client waits far longer than that for its
	// statement.
	const timeout = 2 * time.Second
	contender := pglock.New(tracedPool(t, pg.DSN(""), tr), pglock.WithRequestTimeout(timeout))
	warm := mustLock(t, contender, key+"-warm")
	mustRelease(t, warm)
	tr.on.Store(true)
	done := make(chan error, 1)
	go func() {
		lk, err := contender.TryAcquire(dlocktest.Context(t), key)
		if err == nil {
			lk.Release(context.Background())
		}
		done <- err
	}()
	select {
	case <-stalled:
	case err := <-done:
		t.Fatalf("the contender never read under the row's lock: %v", err)
	}
	// The row is locked by a transaction whose client does nothing.
	other, err := pglock.New(newPool(t, pg.DSN("")), pglock.WithRequestTimeout(dlocktest.HangTimeout)).TryAcquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatalf("TryAcquire while a stalled contender's transaction held the row's lock: %v", err)
	}
	mustRelease(t, other)
	once.Do(func() { close(unstall) })
	<-done // its request's context has ended: the attempt fails
	wantChanges(t, changes, bumps, 2)
}
