package pglock_test

import (
	"context"
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/background"
	"github.com/dlock-go/dlock/pglock"
)

// A waiter is woken by the release's NOTIFY, not by its poll: its backoff
// is a minute, twice the suite's hang bound, so only a notification can
// wake it in time.
func TestWokenByNotify(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	key := dlocktest.Key(t)
	holder, err := pglock.New(newPool(t, pg.DSN(""))).Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	waiter := pglock.New(newPool(t, pg.DSN("")))
	got := acquireLater(dlocktest.Context(t), waiter, key, time.Minute)
	// Release once the waiter listens (its first attempt saw the holder,
	// then it subscribed and tried again): the server lists its LISTEN.
	end := time.Now().Add(dlocktest.HangTimeout)
	for {
		out, err := pg.Exec("", "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %' AND datname = current_database()")
		if err != nil {
			t.Fatal(err)
		}
		if out != "0" {
			break
		}
		if time.Now().After(end) {
			t.Fatal("hang: the waiter never listened")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // its retry after subscribing has run
	if err := holder.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("the waiter was not woken by the release (a one-minute poll would be next)")
	}
}

// A release with writers waiting wakes one of them, by name, not every
// waiter of the key: two writers wait (polling only once a minute), the
// holder's release wakes one, whose release wakes the other. Two
// releases, at most two wake-ups.
// Symptom: every release woke every waiter of the key, and all but one tried and failed.
func TestRelease_WakesOneWaitingWriter(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	holder, err := pglock.New(newPool(t, pg.DSN(""))).Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	w1, w2 := pglock.New(newPool(t, pg.DSN(""))), pglock.New(newPool(t, pg.DSN("")))
	got1 := acquireLater(ctx, w1, key, time.Minute)
	got2 := acquireLater(ctx, w2, key, time.Minute)
	// Release once both listen and both registered, as waits a release
	// may wake by name.
	waitFor(t, "both waiters listening and registered to be woken", func() bool {
		return writers(t, pg, pglock.DefaultTable, key, true) == "2" && pglock.Listening(w1) && pglock.Listening(w2) &&
			pglock.TaggedWaiters(w1, key) == 1 && pglock.TaggedWaiters(w2, key) == 1
	})
	before := pglock.Wakes(w1) + pglock.Wakes(w2)
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for i, got := range []<-chan error{got1, got2} {
		if err := recvWithin(t, got, fmt.Sprintf("waiter %d's wake-up (only a poll, seconds away, would find the key)", i+1)); err != nil {
			t.Fatalf("waiter %d: %v", i+1, err)
		}
	}
	// At most one wait per release (waking every waiter would be 3: both,
	// then the last). A release may wake none: the waiter may take the
	// key by an attempt of its own already in flight.
	if n := pglock.Wakes(w1) + pglock.Wakes(w2) - before; n > 2 {
		t.Errorf("two releases woke %d waits, want at most 2 (one each)", n)
	}
}

// A permit freed while other permits are still held wakes the limited
// waiters, even when a writer waits for the key: the writer cannot take
// the key yet, and writers do not keep permits out.
// Symptom: the release named the waiting writer, who was refused, and the limited waiter found the free permit only at its next poll.
func TestRelease_PermitFreedWhileWriterWaits_WakesLimitedWaiter(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	holders := pglock.New(newPool(t, pg.DSN("")))
	p1, err := holders.Acquire(ctx, key, dlock.WithLimit(2))
	if err != nil {
		t.Fatal(err)
	}
	p2, err := holders.Acquire(ctx, key, dlock.WithLimit(2))
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Release(context.Background())
	writer := pglock.New(newPool(t, pg.DSN("")))
	wgot := make(chan error, 1)
	go func() {
		// Its poll step is capped at a third of its TTL: beyond the
		// test's bound, so only a notice naming it gets it in time.
		lk, err := writer.Acquire(ctx, key, dlock.WithTTL(4*dlocktest.HangTimeout), dlock.WithBackoff(dlock.ConstBackoff{Delay: time.Hour}))
		if err == nil {
			err = lk.Release(context.Background())
		}
		wgot <- err
	}()
	limited := pglock.New(newPool(t, pg.DSN("")))
	attempts := make(chan struct{}, 16)
	lgot := make(chan error, 1)
	go func() {
		// Polls so rarely (its TTL caps the step at a third of it) that
		// only a notice can wake it within the test's bound.
		lk, err := limited.Acquire(ctx, key, dlock.WithLimit(2), dlock.WithTTL(4*dlocktest.HangTimeout),
			dlock.WithBackoff(dlock.ConstBackoff{Delay: time.Hour}),
			dlock.WithCallObserver(dlock.ObserverFunc(func(e dlock.Event) {
				if e.Kind == dlock.EventAttempt {
					attempts <- struct{}{}
				}
			})))
		if err == nil {
			err = lk.Release(context.Background())
		}
		lgot <- err
	}()
	// The limited waiter made its attempt after subscribing, and the
	// writer is registered to be woken by name.
	for i := 0; i < 2; i++ {
		select {
		case <-attempts:
		case <-time.After(dlocktest.HangTimeout):
			t.Fatal("hang: the limited waiter's attempts")
		}
	}
	waitFor(t, "the writer registered to be woken, and both waiters listening", func() bool {
		return writers(t, pg, pglock.DefaultTable, key, true) == "1" && pglock.Listening(limited) && pglock.Listening(writer)
	})
	if err := p1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := recvWithin(t, lgot, "the limited waiter's wake-up by the freed permit"); err != nil {
		t.Fatal(err)
	}
	if err := p2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := recvWithin(t, wgot, "the writer's wake-up once every permit was back"); err != nil {
		t.Fatal(err)
	}
}

// On a table not migrated to version 3 (a writers table without the wake
// column) and WithoutMigrate, releases, registrations and Leave still
// work: the Locker stops naming writers, and a release wakes every
// waiter of the key.
// Symptom: every release failed with "column w.wake does not exist" until someone ran the migration.
func TestRelease_WritersTableWithoutWakeColumn_WakesByKey(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	table := "nowake_leases"
	if err := pglock.Migrate(dlocktest.Context(t), newPool(t, pg.DSN("")), pglock.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Exec("", "ALTER TABLE "+table+"_writers DROP COLUMN wake"); err != nil {
		t.Fatal(err)
	}
	opts := []pglock.Option{pglock.WithTable(table), pglock.WithoutMigrate()}
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	holder, err := pglock.New(newPool(t, pg.DSN("")), opts...).Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	waiter := pglock.New(newPool(t, pg.DSN("")), opts...)
	got := acquireLater(ctx, waiter, key, time.Minute)
	waitFor(t, "the waiter registered and listening", func() bool {
		return writers(t, pg, table, key, false) == "1" && pglock.Listening(waiter)
	})
	if err := holder.Release(ctx); err != nil {
		t.Fatalf("release on a writers table without the wake column: %v", err)
	}
	if err := recvWithin(t, got, "the waiter's wake-up by the release"); err != nil {
		t.Fatal(err)
	}
}

// writers is the number of waiting writers of key in table's writers
// table (only those a release may wake by name: wakeOnly).
func writers(t *testing.T, pg *pgDB, table, key string, wakeOnly bool) string {
	t.Helper()
	q := "SELECT count(*) FROM " + table + "_writers WHERE key = '" + escape(key) + "'"
	if wakeOnly {
		q += " AND wake"
	}
	out, err := pg.Exec("", q)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// recvWithin is what ch yields, failing the test as a hang if it yields
// nothing within dlocktest.HangTimeout.
func recvWithin(t *testing.T, ch <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(dlocktest.HangTimeout):
		t.Fatalf("hang: %s did not come within %v", what, dlocktest.HangTimeout)
	}
	return nil
}

// A Locker that waits again and again keeps one LISTEN connection,
// opened outside its pool (the pool opens no connection for it), and
// closes it a linger after its last wait.
func TestListenConnectionReused(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	key := dlocktest.Key(t)
	holder := pglock.New(newPool(t, pg.DSN("")))
	wpool := newPool(t, pg.DSN(""))
	waiter := pglock.New(wpool)
	ctx := dlocktest.Context(t)
	var pids string
	var conns int64
	for i := 0; i < 5; i++ {
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
		p := listenPIDs(t, pg)
		if i == 0 {
			pids, conns = p, wpool.Stat().NewConnsCount()
		} else if p != pids {
			t.Fatalf("wait %d: LISTEN by backend %s, the first wait's was %s: not reused", i, p, pids)
		}
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
	if n := wpool.Stat().NewConnsCount(); n != conns {
		t.Errorf("the waiter's pool opened %d connections after its first wait: the LISTEN connection came from it", n-conns)
	}
	// Closed a linger after the last wait.
	end := time.Now().Add(dlocktest.HangTimeout)
	for listenPIDs(t, pg) != "" {
		if time.Now().After(end) {
			t.Fatalf("the LISTEN connection outlived its last waiter by %v", dlocktest.HangTimeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A waiter whose wait begins as its Locker's lingering LISTEN connection
// is being closed (a linger of a few milliseconds, waits spaced around
// it) is still woken by the release: its backoff is a minute, so only a
// notification (or the wake-up after a new LISTEN) ends its wait in time.
func TestWatch_WaitBeginningAsLingerEndsIsWoken(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	key := dlocktest.Key(t)
	holder := pglock.New(newPool(t, pg.DSN("")))
	waiter := pglock.New(newPool(t, pg.DSN("")))
	pglock.SetListenLinger(waiter, 3*time.Millisecond)
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 40; i++ {
		ctx := dlocktest.Context(t)
		hl, err := holder.Acquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		got := acquireLater(ctx, waiter, key, time.Minute)
		time.Sleep(time.Duration(rng.Intn(60)) * time.Millisecond)
		if err := hl.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatalf("wait %d: %v", i, err)
		}
		time.Sleep(time.Duration(rng.Intn(8)) * time.Millisecond)
	}
}

// A key whose name begins like a break notice is still a key: its
// waiters are woken by its release, not left to poll.
// Symptom: releases of a key named "dlock-break:…" woke none of its waiters.
func TestWatch_KeyShapedLikeABreakNoticeWakesItsWaiters(t *testing.T) {
	t.Parallel()
	pg := ownPG(t)
	holder := pglock.New(newPool(t, pg.DSN("")))
	waiter := pglock.New(newPool(t, pg.DSN("")))
	key := "dlock-break:" + dlocktest.Key(t)
	lk, err := holder.Acquire(dlocktest.Context(t), key, dlock.WithTTL(5*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		// Its polls are an hour apart and its lease check five minutes:
		// only a wake-up gets it the key within the test's context.
		w, err := waiter.Acquire(dlocktest.Context(t), key, dlock.WithBackoff(dlock.ConstBackoff{Delay: time.Hour}))
		if err == nil {
			err = w.Release(dlocktest.Context(t))
		}
		got <- err
	}()
	waitListens(t, pg, 2) // the holder's Locker and the waiter's
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter of a released key: %v", err)
	}
}

// A pool whose connections have their own notification handler
// (ConnConfig.OnNotification, e.g. an application that LISTENs on its own
// pool connections), with which pgx buffers no notification: the LISTEN
// connection, dialed with the pool's configuration but not its handler,
// still wakes the waiter on the release.
// Symptom: the LISTEN loop dereferenced a nil notification, a panic in a background goroutine that killed the process.
func TestWatch_WakesWaitersOnPoolWithNotificationHandler(t *testing.T) {
	t.Parallel()
	pg := ownPG(t)
	cfg, err := pgxpool.ParseConfig(pg.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.OnNotification = func(*pgconn.PgConn, *pgconn.Notification) {}
	wpool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wpool.Close)
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	holder := pglock.New(newPool(t, pg.DSN("")))
	waiter := pglock.New(wpool)
	hl, err := holder.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	got := acquireLater(ctx, waiter, key, time.Minute)
	waitListening(t, pg)
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

// A pool whose AfterConnect sets something up per connection and whose
// BeforeClose tears it down (a registry of connections, say): the LISTEN
// connection, dialed with the pool's AfterConnect, is closed with its
// BeforeClose, so no entry is left behind.
// Symptom: the LISTEN connection was closed without BeforeClose, each leaving an entry behind.
//
// Not parallel: it waits for all of dlock's background work, which is
// process-wide, to end.
func TestWatch_ListenConnClosedWithPoolBeforeClose(t *testing.T) {
	pg := ownPG(t)
	cfg, err := pgxpool.ParseConfig(pg.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	open := map[*pgx.Conn]bool{}
	cfg.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
		mu.Lock()
		open[c] = true
		mu.Unlock()
		return nil
	}
	cfg.BeforeClose = func(c *pgx.Conn) {
		mu.Lock()
		delete(open, c)
		mu.Unlock()
	}
	wpool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	holder := pglock.New(newPool(t, pg.DSN("")))
	waiter := pglock.New(wpool)
	hl, err := holder.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	got := acquireLater(ctx, waiter, key, 20*time.Millisecond)
	waitListening(t, pg)
	if err := hl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	wpool.Close()
	if !background.Wait(dlocktest.HangTimeout) {
		t.Fatal("the LISTEN loop still runs")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(open) != 0 {
		t.Errorf("%d connections set up by AfterConnect were closed without BeforeClose", len(open))
	}
}

// Many Lockers, each waiting once and then abandoned (their pools
// closed): the server's connections return to what they were once the
// lingers ran out, and every LISTEN loop ends.
//
// Not parallel: it waits for all of dlock's background work, which is
// process-wide, to end.
func TestWatch_AbandonedLockersCloseListenConns(t *testing.T) {
	pg := ownPG(t)
	// The server's client connections, by pid. A connection of the
	// server's start-up may still be closing when the baseline is taken:
	// at the end only baseline pids may remain.
	pids := func() map[string]bool {
		out, err := pg.Exec("", "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()")
		if err != nil {
			t.Fatal(err)
		}
		set := map[string]bool{}
		for _, f := range strings.Fields(out) {
			set[f] = true
		}
		return set
	}
	base := pids()
	extra := func() []string {
		var left []string
		for pid := range pids() {
			if !base[pid] {
				left = append(left, pid)
			}
		}
		return left
	}
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	hpool := newPool(t, pg.DSN(""))
	holder := pglock.New(hpool)
	hl, err := holder.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	const n = 15
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		p := newPool(t, pg.DSN(""))
		w := pglock.New(p)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer p.Close()
			lk, err := w.Acquire(ctx, key, dlock.WithBackoff(dlock.ConstBackoff{Delay: 200 * time.Millisecond}))
			if err == nil {
				err = lk.Release(ctx)
			}
			errs <- err
		}()
	}
	end := time.Now().Add(dlocktest.HangTimeout)
	for {
		out, err := pg.Exec("", "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %' AND datname = current_database()")
		if err != nil {
			t.Fatal(err)
		}
		// The holder's lock listens too (for a break of it), once held
		// for 100ms.
		if out == fmt.Sprint(n+1) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("hang: %s of %d waiters and the holder listen", out, n+1)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := hl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	hpool.Close()
	if !background.Wait(dlocktest.HangTimeout) {
		t.Fatal("LISTEN loops still run after their lingers")
	}
	end = time.Now().Add(dlocktest.HangTimeout)
	for len(extra()) > 0 {
		if time.Now().After(end) {
			t.Fatalf("server connections %v opened by the test still open: leaked", extra())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// acquireLater starts waiter's Acquire of key in the background, with a
// constant backoff step (a minute leaves a notification as the only way
// to be woken in time),
// releases the lock once granted, and sends the outcome on the channel.
func acquireLater(ctx context.Context, waiter dlock.Locker, key string, step time.Duration) <-chan error {
	got := make(chan error, 1)
	go func() {
		lk, err := waiter.Acquire(ctx, key, dlock.WithBackoff(dlock.ConstBackoff{Delay: step}))
		if err == nil {
			rctx, cancel := context.WithTimeout(context.Background(), dlocktest.HangTimeout)
			err = lk.Release(rctx)
			cancel()
		}
		got <- err
	}()
	return got
}

// listenPIDs lists the server processes that ran LISTEN.
func listenPIDs(t *testing.T, pg *pgDB) string {
	t.Helper()
	out, err := pg.Exec("", "SELECT coalesce(string_agg(pid::text, ',' ORDER BY pid), '') FROM pg_stat_activity WHERE query LIKE 'LISTEN %' AND datname = current_database()")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// waitListening waits until some connection of pg has run LISTEN, and a
// little more (the waiter's attempt after subscribing).
func waitListening(t *testing.T, pg *pgDB) {
	t.Helper()
	end := time.Now().Add(dlocktest.HangTimeout)
	for {
		out, err := pg.Exec("", "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %' AND datname = current_database()")
		if err != nil {
			t.Fatal(err)
		}
		if out != "0" {
			break
		}
		if time.Now().After(end) {
			t.Fatal("hang: the waiter never listened")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
}

// waitListens waits (bounded) until n LISTEN connections are open on
// pg's database.
func waitListens(t *testing.T, pg *pgDB, n int) {
	t.Helper()
	q := "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %' AND datname = current_database()"
	for end := time.Now().Add(dlocktest.HangTimeout); ; time.Sleep(10 * time.Millisecond) {
		out, err := pg.Exec("", q)
		if err != nil {
			t.Fatal(err)
		}
		if out == strconv.Itoa(n) {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("hang: %s LISTEN connections, want %d", out, n)
		}
	}
}
