package pglock_test

import (
	"context"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/background"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/pglock"
)

// A waiter whose wait begins as its Locker's lingering LISTEN connection
// is being closed (a linger of a few milliseconds, waits spaced around
// it) is still woken by the release: its backoff is a minute, so only a
// notification (or the wake-up after a new LISTEN) ends its wait in time.
func TestRedTeam_WaitAsLingerEnds(t *testing.T) {
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

// Many Lockers, each waiting once and then abandoned (their pools
// closed): the server's connections return to what they were once the
// lingers ran out, and every LISTEN loop ends.
//
// Not parallel: it waits for all of dlock's background work, which is
// process-wide, to end.
func TestRedTeam_ManyLockersLingerCloses(t *testing.T) {
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

// While the server is stopped (SIGSTOP) or the waiter's link stalls, every
// waiter's Acquire returns by its context, and once the server answers
// again, the LISTEN loops end after their linger.
//
// Not parallel: it waits for all of dlock's background work, which is
// process-wide, to end.
func TestRedTeam_WaitOnHungServer(t *testing.T) {
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
func TestRedTeam_ListenBackendHung(t *testing.T) {
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
