package pglock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/background"
	"github.com/dlock-go/dlock/internal/testserver"
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

// listenPIDs lists the server processes that ran LISTEN.
func listenPIDs(t *testing.T, pg *pgDB) string {
	t.Helper()
	out, err := pg.Exec("", "SELECT coalesce(string_agg(pid::text, ',' ORDER BY pid), '') FROM pg_stat_activity WHERE query LIKE 'LISTEN %' AND datname = current_database()")
	if err != nil {
		t.Fatal(err)
	}
	return out
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
