package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/pglock"
)

// Shared and limited holders, direct and through PgBouncer in transaction
// mode: each holder is its own lease, modes exclude each other, a waiting
// writer keeps readers out until it is granted, leaves or dies, and List
// shows every holder.
func TestModes(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	pb := bouncerFor(t, pg)
	for _, target := range []struct{ name, dsn string }{{"direct", pg.DSN("")}, {"pgbouncer", pb.DSN("")}} {
		newL := func(t *testing.T) *pglock.Locker { return pglock.New(newPool(t, target.dsn)) }
		t.Run(target.name, func(t *testing.T) {
			t.Parallel() // the two targets are independent
			t.Run("ReaderLeasesExpireOneByOne", func(t *testing.T) { testReaderLeases(t, newL) })
			t.Run("ExpiredReaderDoesNotBlockWriter", func(t *testing.T) { testExpiredReader(t, pg, newL) })
			t.Run("DeadHoldersExpireAlone", func(t *testing.T) { testDeadHolders(t, newL) })
			t.Run("SharedRenewedPast3TTL", func(t *testing.T) { testSharedRenewal(t, newL) })
			t.Run("RetryOfSameOwner", func(t *testing.T) { testSharedRetry(t, newL) })
			t.Run("DeadWriterBlocksReadersOneTTL", func(t *testing.T) { testDeadWriter(t, newL) })
			t.Run("WaitingWriterRenewsRegistration", func(t *testing.T) { testWriterRenews(t, newL) })
			t.Run("ModesDoNotMix", func(t *testing.T) { testModesDoNotMix(t, newL) })
			t.Run("List", func(t *testing.T) { testListModes(t, newL) })
		})
	}
}

func mustLock(t *testing.T, l dlock.Locker, key string, opts ...dlock.Option) *dlock.Lock {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), dlocktest.HangTimeout)
	defer cancel()
	lk, err := l.Acquire(ctx, key, opts...)
	if err != nil {
		t.Fatalf("Acquire %q: %v", key, err)
	}
	return lk
}

func mustRelease(t *testing.T, lk *dlock.Lock) {
	t.Helper()
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

func notAcquired(t *testing.T, err error, what string) *dlock.NotAcquiredError {
	t.Helper()
	var na *dlock.NotAcquiredError
	if !errors.As(err, &na) {
		t.Fatalf("%s: %v, want a *dlock.NotAcquiredError", what, err)
	}
	return na
}

func waitLost(t *testing.T, lk *dlock.Lock, what string) {
	t.Helper()
	select {
	case <-lk.Lost():
	case <-time.After(dlocktest.HangTimeout):
		t.Fatalf("hang: %s never lost its lock", what)
	}
}

// Each reader is its own lease: one that stops renewing expires alone,
// the other keeps the key, and the writer gets it only when that one
// leaves, with a token above both.
func testReaderLeases(t *testing.T, newL func(*testing.T) *pglock.Locker) {
	key := dlocktest.Key(t)
	crashed := mustLock(t, newL(t), key, dlock.WithShared(), dlock.WithTTL(time.Second), dlock.WithAutoRefresh(false))
	// The server set the crashed reader's expiry before this, on the same
	// clock: it has passed on the server too once expired has.
	expired := time.Now().Add(time.Second)
	// The renewing reader's TTL leaves its renewals room on a loaded
	// machine.
	alive := mustLock(t, newL(t), key, dlock.WithShared(), dlock.WithTTL(3*time.Second))
	if crashed.Token() == alive.Token() || crashed.Owner() == alive.Owner() || !alive.Fence().Shared {
		t.Fatalf("readers share a lease: tokens %d %d owners %s %s", crashed.Token(), alive.Token(), crashed.Owner(), alive.Owner())
	}
	waitLost(t, crashed, "the reader that stopped renewing")
	// Lost() closes at the local deadline, a drift allowance before the
	// server's expiry.
	time.Sleep(time.Until(expired))
	select {
	case <-alive.Lost():
		t.Fatalf("the renewing reader lost its lease with the other: %v", alive.Err())
	default:
	}
	w := newL(t)
	_, err := w.TryAcquire(dlocktest.Context(t), key)
	na := notAcquired(t, err, "writer while a reader renews")
	if len(na.Holders) != 1 || na.Holders[0].Owner != alive.Owner() || na.Holders[0].Mode != dlock.Shared {
		t.Fatalf("holders %+v, want the renewing reader alone (owner %s)", na.Holders, alive.Owner())
	}
	mustRelease(t, alive)
	lk, err := w.TryAcquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatalf("writer after the last reader left: %v", err)
	}
	defer mustRelease(t, lk)
	if lk.Token() <= max(crashed.Token(), alive.Token()) {
		t.Fatalf("writer token %d not above the readers' %d, %d", lk.Token(), crashed.Token(), alive.Token())
	}
}

// A reader whose lease expired on the server (its process stopped; here
// the row's expiry is moved into the past behind its back) does not keep
// a writer out, and its late renewal does not take the key back.
func testExpiredReader(t *testing.T, pg *pgDB, newL func(*testing.T) *pglock.Locker) {
	key := dlocktest.Key(t)
	r := mustLock(t, newL(t), key, dlock.WithShared(), dlock.WithTTL(1500*time.Millisecond))
	if _, err := pg.Exec("", "UPDATE dlock_leases_holders SET expires_at = clock_timestamp() - interval '1 millisecond' WHERE key = '"+escape(key)+"'"); err != nil {
		t.Fatal(err)
	}
	w, err := newL(t).TryAcquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatalf("writer after the reader expired: %v", err)
	}
	defer mustRelease(t, w)
	if w.Token() <= r.Token() {
		t.Fatalf("writer token %d not above the expired reader's %d", w.Token(), r.Token())
	}
	waitLost(t, r, "the expired reader")
	if err := r.Release(dlocktest.Context(t)); err == nil {
		t.Fatal("the expired reader's Release succeeded")
	}
	if _, err := newL(t).TryAcquire(dlocktest.Context(t), key, dlock.WithShared()); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("reader while the writer holds: %v, want ErrNotAcquired", err)
	}
}

// Holders whose process died (granted through the driver, then neither
// renewed nor released, as a killed process leaves them) expire on the
// server at their own TTL: a dead reader beside a live one keeps the key
// only until then and the writer gets it once the live one leaves; a dead
// permit holder frees its permit.
func testDeadHolders(t *testing.T, newL func(*testing.T) *pglock.Locker) {
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	l := newL(t)
	// A dead holder's TTL leaves room for the checks made while it lives
	// on a loaded machine; expired is when it has passed on the server
	// (same clock) for the last one granted.
	const deadTTL = 4 * time.Second
	var expired time.Time
	dead := func(key string, mode driver.Mode, limit int) uint64 {
		t.Helper()
		req := &driver.Request{Key: key, Owner: dlock.NewOwner(), TTL: deadTTL, Metadata: map[string]string{}, Mode: mode, Limit: limit}
		tok, _, err := pglock.TryRaw(ctx, l, req)
		if err != nil {
			t.Fatalf("%s grant: %v", mode, err)
		}
		expired = time.Now().Add(deadTTL)
		return tok
	}
	deadTok := dead(key, driver.Shared, 0)
	alive := mustLock(t, newL(t), key, dlock.WithShared())
	_, err := newL(t).TryAcquire(ctx, key)
	if na := notAcquired(t, err, "writer over a dead and a live reader"); len(na.Holders) != 2 {
		t.Fatalf("holders %+v, want both readers", na.Holders)
	}
	time.Sleep(time.Until(expired)) // the dead reader's TTL
	_, err = newL(t).TryAcquire(ctx, key)
	if na := notAcquired(t, err, "writer over the live reader"); len(na.Holders) != 1 || na.Holders[0].Owner != alive.Owner() {
		t.Fatalf("holders %+v, want the live reader alone", na.Holders)
	}
	mustRelease(t, alive)
	w := mustLock(t, newL(t), key)
	if w.Token() <= max(deadTok, alive.Token()) {
		t.Fatalf("writer token %d not above the readers' %d, %d", w.Token(), deadTok, alive.Token())
	}
	mustRelease(t, w)

	sem := dlocktest.Key(t)
	dead(sem, driver.Limited, 1)
	if _, err := newL(t).TryAcquire(ctx, sem, dlock.WithLimit(1)); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("the one permit while a dead holder's lease lives: %v", err)
	}
	p := mustLock(t, newL(t), sem, dlock.WithLimit(1), dlock.WithWait(dlocktest.HangTimeout))
	mustRelease(t, p)
}

// A reader on a short TTL is renewed (by the batched renewal) for several
// TTLs, and keeps a writer out meanwhile.
func testSharedRenewal(t *testing.T, newL func(*testing.T) *pglock.Locker) {
	key := dlocktest.Key(t)
	l := newL(t)
	// A TTL well above a renewal's round trip on a loaded machine: the
	// promise is that renewals keep the locks past 3 TTLs.
	const ttl = 2 * time.Second
	r1 := mustLock(t, l, key, dlock.WithShared(), dlock.WithTTL(ttl))
	r2 := mustLock(t, l, key+"/other", dlock.WithShared(), dlock.WithTTL(ttl))
	x := mustLock(t, l, key+"/x", dlock.WithTTL(ttl)) // one batch: both tables
	time.Sleep(3*ttl + ttl/2)
	for _, lk := range []*dlock.Lock{r1, r2, x} {
		select {
		case <-lk.Lost():
			t.Fatalf("lock %d lost while renewed: %v", lk.Token(), lk.Err())
		default:
		}
	}
	if _, err := newL(t).TryAcquire(dlocktest.Context(t), key); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("writer while a renewed reader holds: %v, want ErrNotAcquired", err)
	}
	for _, lk := range []*dlock.Lock{r1, r2, x} {
		mustRelease(t, lk)
	}
}

// An attempt retried with the same owner (its first reply lost) gets the
// holder row it already has, with its token; an attempt whose outcome is
// unknown is undone by Abort, which frees the permit at once.
func testSharedRetry(t *testing.T, newL func(*testing.T) *pglock.Locker) {
	ctx := dlocktest.Context(t)
	l := newL(t)
	for _, mode := range []driver.Mode{driver.Shared, driver.Limited} {
		key := dlocktest.Key(t)
		req := &driver.Request{Key: key, Owner: dlock.NewOwner(), TTL: time.Minute, Metadata: map[string]string{}, Mode: mode, Limit: 1}
		tok1, release, err := pglock.TryRaw(ctx, l, req)
		if err != nil {
			t.Fatalf("%s: first attempt: %v", mode, err)
		}
		tok2, _, err := pglock.TryRaw(ctx, l, req)
		if err != nil || tok2 != tok1 {
			t.Fatalf("%s: retry with the same owner: token %d, %v; want token %d", mode, tok2, err, tok1)
		}
		if err := release(ctx); err != nil {
			t.Fatalf("%s: release: %v", mode, err)
		}
		if err := release(ctx); err != nil {
			t.Fatalf("%s: retried release: %v", mode, err)
		}
		// Granted, then undone as an attempt whose reply was lost.
		req.Owner = dlock.NewOwner()
		if _, _, err := pglock.TryRaw(ctx, l, req); err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		if err := pglock.Abort(ctx, l, req); err != nil {
			t.Fatalf("%s: abort: %v", mode, err)
		}
		w, err := newL(t).TryAcquire(ctx, key)
		if err != nil {
			t.Fatalf("%s: writer after the abort: %v (a leftover holder row)", mode, err)
		}
		mustRelease(t, w)
	}
}

// A waiting writer's registration keeps new readers out; TryAcquire does
// not register; Leave withdraws it at once; a writer that died without
// leaving keeps readers out until its registration expires, a TTL after
// its last attempt.
func testDeadWriter(t *testing.T, newL func(*testing.T) *pglock.Locker) {
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	l := newL(t)
	r1 := mustLock(t, l, key, dlock.WithShared())
	defer mustRelease(t, r1)
	// TryAcquire registers nothing.
	_, err := newL(t).TryAcquire(ctx, key)
	notAcquired(t, err, "exclusive TryAcquire over a reader")
	r2, err := l.TryAcquire(ctx, key, dlock.WithShared())
	if err != nil {
		t.Fatalf("reader after an exclusive TryAcquire: %v (TryAcquire registered a writer?)", err)
	}
	mustRelease(t, r2)
	attempt := func(waiter string, ttl time.Duration) {
		t.Helper()
		req := &driver.Request{Key: key, Owner: dlock.NewOwner(), TTL: ttl, Metadata: map[string]string{}, Waiter: waiter}
		_, _, err := pglock.TryRaw(ctx, l, req)
		notAcquired(t, err, "a writer's attempt over a reader")
	}
	// Registered, then leaves.
	attempt("leaver", time.Minute)
	_, err = l.TryAcquire(ctx, key, dlock.WithShared())
	if na := notAcquired(t, err, "reader while a writer waits"); len(na.Holders) != 1 || na.Holders[0].Owner != r1.Owner() {
		t.Errorf("holders named %+v, want the reader holding", na.Holders)
	}
	if err := pglock.Leave(ctx, l, key, "leaver"); err != nil {
		t.Fatal(err)
	}
	if err := pglock.Leave(ctx, l, key, "unknown"); err != nil {
		t.Fatalf("Leave of an unknown waiter: %v", err)
	}
	r3, err := l.TryAcquire(ctx, key, dlock.WithShared())
	if err != nil {
		t.Fatalf("reader after the writer left: %v", err)
	}
	mustRelease(t, r3)
	// Registered, then dies: readers are refused, and admitted again
	// once its registration (one TTL) expires.
	attempt("dead", time.Second)
	start := time.Now()
	if _, err := l.TryAcquire(ctx, key, dlock.WithShared()); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("reader while a dead writer's registration lives: %v", err)
	}
	r4 := mustLock(t, l, key, dlock.WithShared(), dlock.WithBackoff(dlock.ConstBackoff{Delay: 50 * time.Millisecond}))
	mustRelease(t, r4)
	if d := time.Since(start); d > dlocktest.HangTimeout {
		t.Fatalf("readers kept out %v by a dead writer whose TTL was 1s", d)
	}
}

// A writer waiting longer than its TTL keeps readers out all along: its
// refused attempts renew its registration before it expires; once the
// reader leaves, the writer gets the key.
func testWriterRenews(t *testing.T, newL func(*testing.T) *pglock.Locker) {
	key := dlocktest.Key(t)
	r := mustLock(t, newL(t), key, dlock.WithShared())
	writer := newL(t)
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), dlocktest.HangTimeout)
		defer cancel()
		lk, err := writer.Acquire(ctx, key, dlock.WithTTL(time.Second))
		if err == nil {
			err = lk.Release(ctx)
		}
		got <- err
	}()
	probe := newL(t)
	end := time.Now().Add(dlocktest.HangTimeout)
	for {
		lk, err := probe.TryAcquire(dlocktest.Context(t), key, dlock.WithShared())
		if errors.Is(err, dlock.ErrNotAcquired) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		mustRelease(t, lk)
		if time.Now().After(end) {
			t.Fatal("hang: the waiting writer never kept readers out")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := 1; i <= 5; i++ { // 2.5 TTLs of the writer
		time.Sleep(500 * time.Millisecond)
		if _, err := probe.TryAcquire(dlocktest.Context(t), key, dlock.WithShared()); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("reader after %v of a writer waiting on a 1s TTL: %v, want ErrNotAcquired", time.Duration(i)*500*time.Millisecond, err)
		}
	}
	mustRelease(t, r)
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("the waiting writer: %v", err)
		}
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: the writer did not get the key after the reader left")
	}
}

// A key's mode and limit are its holders': another mode is refused naming
// them, another limit is ErrLimitMismatch naming both limits.
func testModesDoNotMix(t *testing.T, newL func(*testing.T) *pglock.Locker) {
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	s := mustLock(t, newL(t), key, dlock.WithShared())
	_, err := newL(t).TryAcquire(ctx, key, dlock.WithLimit(3))
	if na := notAcquired(t, err, "limited over shared"); len(na.Holders) != 1 || na.Holders[0].Mode != dlock.Shared || na.Holders[0].Owner != s.Owner() {
		t.Fatalf("holders %+v, want the shared holder", na.Holders)
	}
	mustRelease(t, s)
	p := mustLock(t, newL(t), key, dlock.WithLimit(2))
	_, err = newL(t).TryAcquire(ctx, key, dlock.WithShared())
	if na := notAcquired(t, err, "shared over limited"); len(na.Holders) != 1 || na.Holders[0].Mode != dlock.Limited {
		t.Fatalf("holders %+v, want the permit holder", na.Holders)
	}
	_, err = newL(t).TryAcquire(ctx, key, dlock.WithLimit(5))
	if !errors.Is(err, dlock.ErrLimitMismatch) || !strings.Contains(err.Error(), "2") || !strings.Contains(err.Error(), "5") {
		t.Fatalf("WithLimit(5) on a semaphore of 2: %v, want ErrLimitMismatch naming both", err)
	}
	p2 := mustLock(t, newL(t), key, dlock.WithLimit(2))
	if p2.Token() <= p.Token() {
		t.Fatalf("permit tokens %d then %d", p.Token(), p2.Token())
	}
	_, err = newL(t).TryAcquire(ctx, key, dlock.WithLimit(2))
	if na := notAcquired(t, err, "third permit of 2"); len(na.Holders) != 2 {
		t.Fatalf("holders %+v, want both permit holders", na.Holders)
	}
	mustRelease(t, p)
	mustRelease(t, p2)
	// Free again: the next grant sets mode and limit afresh.
	p3 := mustLock(t, newL(t), key, dlock.WithLimit(5))
	mustRelease(t, p3)
	x := mustLock(t, newL(t), key)
	mustRelease(t, x)
}

// List shows every holder of a shared or limited key, its mode and limit.
func testListModes(t *testing.T, newL func(*testing.T) *pglock.Locker) {
	l := newL(t)
	key := dlocktest.Key(t)
	s1 := mustLock(t, l, key+"/a", dlock.WithShared(), dlock.WithMetadata("who", "s1"))
	s2 := mustLock(t, newL(t), key+"/a", dlock.WithShared())
	p := mustLock(t, l, key+"/b", dlock.WithLimit(3))
	x := mustLock(t, l, key+"/c")
	infos, err := l.List(dlocktest.Context(t), key+"/")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 3 {
		t.Fatalf("List = %+v, want 3 keys", infos)
	}
	a, b, c := infos[0], infos[1], infos[2]
	if a.Mode != dlock.Shared || len(a.Holders) != 2 || a.Holders[0].Owner != s1.Owner() || a.Holders[1].Owner != s2.Owner() ||
		a.Holders[0].Metadata["who"] != "s1" || a.Holders[1].Mode != dlock.Shared || a.Holders[1].Token != s2.Token() || a.Holders[0].TTL <= 0 {
		t.Errorf("shared key: %+v, want both readers in token order", a)
	}
	if b.Mode != dlock.Limited || b.Limit != 3 || len(b.Holders) != 1 || b.Holders[0].Owner != p.Owner() || b.Holders[0].Mode != dlock.Limited {
		t.Errorf("limited key: %+v, want limit 3 and the permit holder", b)
	}
	if c.Mode != dlock.Exclusive || len(c.Holders) != 1 || c.Holders[0].Owner != x.Owner() {
		t.Errorf("exclusive key: %+v", c)
	}
	mustRelease(t, s1)
	infos, err = l.List(dlocktest.Context(t), key+"/a")
	if err != nil || len(infos) != 1 || len(infos[0].Holders) != 1 || infos[0].Holders[0].Owner != s2.Owner() {
		t.Errorf("after one reader left: %+v, %v", infos, err)
	}
	for _, lk := range []*dlock.Lock{s2, p, x} {
		mustRelease(t, lk)
	}
}

// Exclusive, shared and limited attempts racing on one key from several
// Lockers, with renewals running (holds up to 0.8s on a 2s TTL, renewed
// every third of it): never an exclusive holder with anyone else, never
// shared and limited holders together, never more than the limit, never a
// token twice. Direct and through PgBouncer.
func TestModesRace(t *testing.T) {
	t.Parallel()
	pg := ownPG(t)
	pb := bouncerFor(t, pg)
	for _, target := range []struct{ name, dsn string }{{"direct", pg.DSN("")}, {"pgbouncer", pb.DSN("")}} {
		t.Run(target.name, func(t *testing.T) {
			key := dlocktest.Key(t)
			const workers, rounds, limit = 8, 15, 2
			var (
				mu       sync.Mutex
				in       [3]int
				tokens   = map[uint64]bool{}
				problems []string
				wg       sync.WaitGroup
				errs     = make(chan error, workers)
				modeOpts = [][]dlock.Option{nil, {dlock.WithShared()}, {dlock.WithLimit(limit)}}
				grantsBy [3]int
			)
			check := func(m int, delta int, tok uint64) {
				mu.Lock()
				defer mu.Unlock()
				in[m] += delta
				if delta > 0 {
					grantsBy[m]++
					if tokens[tok] {
						problems = append(problems, fmt.Sprintf("token %d granted twice", tok))
					}
					tokens[tok] = true
				}
				switch {
				case in[0] > 1, in[0] == 1 && in[1]+in[2] > 0:
					problems = append(problems, fmt.Sprintf("exclusive with others: %v", in))
				case in[1] > 0 && in[2] > 0:
					problems = append(problems, fmt.Sprintf("shared and limited together: %v", in))
				case in[2] > limit:
					problems = append(problems, fmt.Sprintf("%d limited holders, limit %d", in[2], limit))
				}
			}
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					l := pglock.New(newPool(t, target.dsn))
					for r := range rounds {
						m := (w + r) % 3
						// The TTL leaves renewals room on a loaded
						// machine: the promise is exclusion, not expiry.
						opts := append([]dlock.Option{dlock.WithTTL(5 * time.Second)}, modeOpts[m]...)
						lk, err := l.TryAcquire(dlocktest.Context(t), key, opts...)
						if errors.Is(err, dlock.ErrNotAcquired) || errors.Is(err, dlock.ErrTransient) {
							// Held; or granted too slowly on a loaded
							// machine (no validity left) and released.
							time.Sleep(time.Millisecond)
							continue
						}
						if err != nil {
							errs <- err
							return
						}
						check(m, 1, lk.Token())
						time.Sleep(time.Duration(r%3) * 400 * time.Millisecond)
						check(m, -1, 0)
						if err := lk.Release(dlocktest.Context(t)); err != nil {
							errs <- fmt.Errorf("release: %w", err)
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			for _, p := range problems {
				t.Error(p)
			}
			t.Logf("grants: exclusive %d, shared %d, limited %d", grantsBy[0], grantsBy[1], grantsBy[2])
			// Which modes get in is up to the race (TryAcquire does not
			// register writers, so overlapping readers can keep the others
			// out for a whole run): the test is about safety.
			if grantsBy[0]+grantsBy[1]+grantsBy[2] == 0 {
				t.Error("nothing was granted")
			}
		})
	}
}

// Every mode at once on one key, on short leases that are renewed while
// held (each renewal bumps the key row's gen and races
// the grants), blocking Acquires (waiting writers register and leave) and
// TryAcquires, direct and through PgBouncer together on one table. At each
// grant, the holders still valid by their own local deadline (which comes
// before their rows expire on the server) must be compatible with the new
// one, and its token above every earlier exclusive holder's and, for an
// exclusive grant, every earlier holder's.
func TestModes_ExclusionAndTokenOrderUnderRenewals(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	pb := bouncerFor(t, pg)
	key := dlocktest.Key(t)
	const workers, limit = 6, 2
	type held struct {
		lk   *dlock.Lock
		mode int
		done bool
	}
	var (
		mu       sync.Mutex
		cur      []*held
		maxTok   uint64 // highest token granted so far
		maxExcl  uint64 // highest exclusive token granted so far
		problems []string
		grants   [3]int
		wg       sync.WaitGroup
	)
	grant := func(lk *dlock.Lock, m int) *held {
		mu.Lock()
		defer mu.Unlock()
		now := time.Now()
		var in [3]int
		live := cur[:0]
		for _, h := range cur {
			if h.done || !now.Before(h.lk.Deadline()) {
				continue
			}
			live = append(live, h)
			in[h.mode]++
		}
		cur = live
		in[m]++
		switch {
		case in[0] > 1, in[0] == 1 && in[1]+in[2] > 0:
			problems = append(problems, fmt.Sprintf("exclusive with others: %v (token %d)", in, lk.Token()))
		case in[1] > 0 && in[2] > 0:
			problems = append(problems, fmt.Sprintf("shared and limited together: %v (token %d)", in, lk.Token()))
		case in[2] > limit:
			problems = append(problems, fmt.Sprintf("%d permits of %d (token %d)", in[2], limit, lk.Token()))
		}
		if lk.Token() <= maxExcl || (m == 0 && lk.Token() <= maxTok) {
			problems = append(problems, fmt.Sprintf("mode %d token %d not above earlier tokens (max %d, exclusive %d)", m, lk.Token(), maxTok, maxExcl))
		}
		maxTok = max(maxTok, lk.Token())
		if m == 0 {
			maxExcl = max(maxExcl, lk.Token())
		}
		grants[m]++
		h := &held{lk: lk, mode: m}
		cur = append(cur, h)
		return h
	}
	modeOpts := [][]dlock.Option{nil, {dlock.WithShared()}, {dlock.WithLimit(limit)}}
	stop := time.Now().Add(2 * time.Second)
	errs := make(chan error, workers)
	for w := range workers {
		dsn := pg.DSN("")
		if w%2 == 1 {
			dsn = pb.DSN("")
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := pglock.New(newPool(t, dsn))
			rng := rand.New(rand.NewPCG(uint64(w), 14))
			for time.Now().Before(stop) {
				m := rng.IntN(3)
				opts := append([]dlock.Option{dlock.WithTTL(300 * time.Millisecond)}, modeOpts[m]...)
				var (
					lk  *dlock.Lock
					err error
				)
				if rng.IntN(2) == 0 {
					lk, err = l.TryAcquire(dlocktest.Context(t), key, opts...)
				} else {
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(50+rng.IntN(250))*time.Millisecond)
					lk, err = l.Acquire(ctx, key, opts...)
					cancel()
				}
				if err != nil {
					if errors.Is(err, dlock.ErrNotAcquired) || errors.Is(err, dlock.ErrTransient) ||
						errors.Is(err, context.DeadlineExceeded) {
						continue
					}
					errs <- err
					return
				}
				h := grant(lk, m)
				select {
				case <-lk.Lost():
				case <-time.After(time.Duration(rng.IntN(250)) * time.Millisecond):
				}
				mu.Lock()
				h.done = true
				mu.Unlock()
				_ = lk.Release(dlocktest.Context(t))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
	t.Logf("grants: exclusive %d, shared %d, limited %d", grants[0], grants[1], grants[2])
}

// Hierarchical keys never contend, whatever their modes: a, a/b and a/b/c
// are three keys; List under "a" shows each with its own mode and limit.
func TestModes_HierarchicalKeysNeverContend(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	ctx := dlocktest.Context(t)
	l := pglock.New(newPool(t, pg.DSN("")))
	base := dlocktest.Key(t)
	x := mustLock(t, l, base)
	s := mustLock(t, l, base+"/b", dlock.WithShared())
	p := mustLock(t, l, base+"/b/c", dlock.WithLimit(2))
	for _, k := range []struct {
		key string
		opt []dlock.Option
	}{{base + "/b/c", nil}, {base, []dlock.Option{dlock.WithShared()}}, {base + "/b", []dlock.Option{dlock.WithLimit(1)}}} {
		_, err := l.TryAcquire(ctx, k.key, k.opt...)
		if !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("%s: %v, want its own holder to refuse it", k.key, err)
		}
	}
	infos, err := l.List(ctx, base)
	if err != nil || len(infos) != 3 {
		t.Fatalf("List: %+v %v", infos, err)
	}
	want := []struct {
		mode  dlock.Mode
		limit int
	}{{dlock.Exclusive, 0}, {dlock.Shared, 0}, {dlock.Limited, 2}}
	for i, in := range infos {
		if in.Mode != want[i].mode || in.Limit != want[i].limit || len(in.Holders) != 1 {
			t.Fatalf("List[%d] = %+v, want mode %v limit %d, one holder", i, in, want[i].mode, want[i].limit)
		}
	}
	for _, lk := range []*dlock.Lock{x, s, p} {
		mustRelease(t, lk)
	}
}

// A semaphore whose every holder expired is free: a request with another
// limit sets the limit afresh instead of failing with ErrLimitMismatch; a
// live holder makes it a mismatch naming both limits, also when the
// semaphore is full; an exclusive holder or shared holders make any limit a
// plain refusal (the key is not a semaphore).
func TestLimited_MismatchOnlyWithALiveLimitedHolder(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	ctx := dlocktest.Context(t)
	l := pglock.New(newPool(t, pg.DSN("")))
	key := dlocktest.Key(t)
	raw := func(mode driver.Mode, limit int, ttl time.Duration) {
		t.Helper()
		req := &driver.Request{Key: key, Owner: dlock.NewOwner(), TTL: ttl, Metadata: map[string]string{}, Mode: mode, Limit: limit}
		if _, _, err := pglock.TryRaw(ctx, l, req); err != nil {
			t.Fatalf("%s %d: %v", mode, limit, err)
		}
	}
	raw(driver.Limited, 1, 200*time.Millisecond) // dies
	if _, err := l.TryAcquire(ctx, key, dlock.WithLimit(3)); !errors.Is(err, dlock.ErrLimitMismatch) {
		t.Fatalf("limit 3 over a live holder of limit 1: %v, want ErrLimitMismatch", err)
	} else if !strings.Contains(err.Error(), "1") || !strings.Contains(err.Error(), "3") {
		t.Fatalf("mismatch does not name both limits: %v", err)
	}
	time.Sleep(300 * time.Millisecond)
	p, err := l.TryAcquire(ctx, key, dlock.WithLimit(dlock.MaxLimit))
	if err != nil {
		t.Fatalf("limit MaxLimit after the last holder expired: %v", err)
	}
	infos, err := l.List(ctx, key)
	if err != nil || len(infos) != 1 || infos[0].Limit != dlock.MaxLimit || infos[0].Mode != dlock.Limited || len(infos[0].Holders) != 1 {
		t.Fatalf("List: %+v %v, want one limited holder, limit %d", infos, err, dlock.MaxLimit)
	}
	mustRelease(t, p)

	// Full semaphore of 1: same limit is refused, another is a mismatch.
	raw(driver.Limited, 1, time.Minute)
	if _, err := l.TryAcquire(ctx, key, dlock.WithLimit(1)); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("full semaphore: %v, want ErrNotAcquired", err)
	}
	if _, err := l.TryAcquire(ctx, key, dlock.WithLimit(2)); !errors.Is(err, dlock.ErrLimitMismatch) {
		t.Fatalf("full semaphore, other limit: %v, want ErrLimitMismatch", err)
	}

	for _, mode := range []driver.Mode{driver.Exclusive, driver.Shared} {
		k2 := dlocktest.Key(t) + "/" + mode.String()
		req := &driver.Request{Key: k2, Owner: dlock.NewOwner(), TTL: time.Minute, Metadata: map[string]string{}, Mode: mode}
		if _, _, err := pglock.TryRaw(ctx, l, req); err != nil {
			t.Fatal(err)
		}
		_, err := l.TryAcquire(ctx, k2, dlock.WithLimit(1))
		if errors.Is(err, dlock.ErrLimitMismatch) || !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("limited over %s holder: %v, want a plain refusal", mode, err)
		}
	}
}

// Writer preference as the documented least-privilege role: a waiting
// writer registers (INSERT, UPDATE on the writers table), keeps a new
// reader out, and its Leave (DELETE) lets readers in at once; renewing a
// reader locks the key's row (UPDATE on the lease table).
func TestWriterPreference_WorksForLeastPrivilegeRole(t *testing.T) {
	t.Parallel()
	pg := ownPG(t)
	if err := pglock.Migrate(dlocktest.Context(t), newPool(t, pg.DSN(""))); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		"CREATE ROLE app LOGIN PASSWORD 'pw'",
		"GRANT SELECT, INSERT, UPDATE ON " + pglock.DefaultTable + " TO app",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON " + pglock.DefaultTable + "_holders, " + pglock.DefaultTable + "_writers TO app",
		"GRANT USAGE ON SEQUENCE " + pglock.DefaultTable + "_token_seq TO app",
		"GRANT SELECT ON " + pglock.MigrationsTable + " TO app",
	} {
		if _, err := pg.Exec("", sql); err != nil {
			t.Fatal(err)
		}
	}
	app := strings.Replace(pg.DSN(""), testserver.PostgresUser+"@", "app:pw@", 1)
	newL := func() *pglock.Locker { return pglock.New(newPool(t, app)) }
	key := dlocktest.Key(t)
	// r1's TTL is well above a renewal's round trip on a loaded machine.
	const ttl = 2 * time.Second
	r1 := mustLock(t, newL(), key, dlock.WithShared(), dlock.WithTTL(ttl))
	wctx, wcancel := context.WithCancel(context.Background())
	wdone := make(chan error, 1)
	go func() {
		_, err := newL().Acquire(wctx, key, dlock.WithTTL(time.Minute))
		wdone <- err
	}()
	// The writer's registration keeps the next reader out.
	reader := newL()
	deadline := time.Now().Add(5 * time.Second)
	for {
		lk, err := reader.TryAcquire(dlocktest.Context(t), key, dlock.WithShared())
		if errors.Is(err, dlock.ErrNotAcquired) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		mustRelease(t, lk)
		if time.Now().After(deadline) {
			t.Fatal("a waiting writer never kept a reader out")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(ttl + ttl/4) // r1 renewed past its TTL
	select {
	case <-r1.Lost():
		t.Fatalf("reader lost while renewed by the least-privilege role: %v", r1.Err())
	default:
	}
	wcancel()
	if err := <-wdone; err == nil {
		t.Fatal("writer acquired while the reader held")
	}
	// Leave runs in the background: the reader gets in well before the
	// registration's minute.
	lk := mustLock(t, reader, key, dlock.WithShared(), dlock.WithWait(10*time.Second))
	mustRelease(t, lk)
	mustRelease(t, r1)
}

// Bad input in the shared and limited modes is refused with an error,
// never a panic, a hang or a write: a nil context, limits out of range, shared and limited
// together, keys PostgreSQL's text cannot hold.
func TestModes_BadInputRefusedWithoutWrites(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	ctx := dlocktest.Context(t)
	pool := newPool(t, pg.DSN(""))
	if err := pglock.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	l := pglock.New(pool)
	key := dlocktest.Key(t)
	cases := []struct {
		name string
		ctx  context.Context
		key  string
		opts []dlock.Option
	}{
		{"nil ctx shared", nil, key, []dlock.Option{dlock.WithShared()}},
		{"nil ctx limited", nil, key, []dlock.Option{dlock.WithLimit(2)}},
		{"limit 0", ctx, key, []dlock.Option{dlock.WithLimit(0)}},
		{"limit -1", ctx, key, []dlock.Option{dlock.WithLimit(-1)}},
		{"limit MaxLimit+1", ctx, key, []dlock.Option{dlock.WithLimit(dlock.MaxLimit + 1)}},
		{"limit huge", ctx, key, []dlock.Option{dlock.WithLimit(1 << 40)}},
		{"shared and limited", ctx, key, []dlock.Option{dlock.WithShared(), dlock.WithLimit(2)}},
		{"NUL key limited", ctx, "a\x00b", []dlock.Option{dlock.WithLimit(2)}},
		{"bad UTF-8 key shared", ctx, "a\xffb", []dlock.Option{dlock.WithShared()}},
	}
	for _, c := range cases {
		for _, try := range []bool{true, false} {
			var err error
			if try {
				_, err = l.TryAcquire(c.ctx, c.key, c.opts...)
			} else {
				_, err = l.Acquire(c.ctx, c.key, append(c.opts, dlock.WithWait(time.Second))...)
			}
			if err == nil || errors.Is(err, dlock.ErrNotAcquired) {
				t.Errorf("%s (try %v): %v, want an input error", c.name, try, err)
			}
		}
	}
	if n, err := pg.Exec("", "SELECT count(*) FROM dlock_leases_holders"); err != nil || n != "0" {
		t.Fatalf("holder rows after bad input: %s %v", n, err)
	}
}

// A limited TryAcquire gets a free permit although other grants keep
// changing the key's row between its snapshot and its lock.
// Symptom: the TryAcquire was refused although permits were free.
func TestTryLimited_GetsInWhileOtherGrantsChangeTheRow(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	admin := newPool(t, pg.DSN(""))
	key := "churn-" + fmt.Sprint(time.Now().UnixNano())
	first := mustLock(t, pglock.New(newPool(t, pg.DSN(""))), key, dlock.WithLimit(8))
	defer mustRelease(t, first)

	// Each attempt's snapshot sees a row that changes before its
	// statement can lock it, unless it reads under the lock.
	tr, bumps := changeRowUnder(admin, key, 8, func(sql string, inTx bool) bool {
		// The attempt's first statement: the one-statement form (outside
		// a transaction) or the lock of a transaction.
		return strings.Contains(sql, "FOR UPDATE") || (!inTx && strings.Contains(sql, "hlimit"))
	})
	pool := tracedPool(t, pg.DSN(""), tr)
	l := pglock.New(pool)
	warm := mustLock(t, l, key+"-warm") // the schema exists: no migration statements traced
	mustRelease(t, warm)

	tr.on.Store(true)
	lk, err := l.TryAcquire(dlocktest.Context(t), key, dlock.WithLimit(8))
	tr.on.Store(false)
	if err != nil {
		t.Fatalf("TryAcquire of a permit while 1 of 8 is held and the key's row keeps changing: %v", err)
	}
	mustRelease(t, lk)
	n := int(tr.changes.Load())
	if n == 0 {
		t.Fatal("the row never changed under the attempt: the test exercised nothing")
	}
	wantChanges(t, tr, bumps, n)
}

// changeRowUnder returns a tracer that, before each of the first n
// statements for which first holds, takes key's row lock in an admin
// transaction and, once that statement waits on the lock, bumps the row's
// gen (as another grant, or a reader's renewal or release, does) and
// commits; and the channel of each change's outcome.
func changeRowUnder(admin *pgxpool.Pool, key string, n int, first func(sql string, inTx bool) bool) (*churnTracer, chan error) {
	bumps := make(chan error, n)
	tr := &churnTracer{}
	tr.onStart = func(ctx context.Context, sql string, inTx bool) {
		// Statements of one attempt come one at a time: the count of
		// changes started decides, not the changes' outcomes so far.
		if !first(sql, inTx) || int(tr.changes.Load()) == n {
			return
		}
		tr.changes.Add(1)
		tx, err := admin.Begin(ctx)
		if err == nil {
			_, err = tx.Exec(ctx, `SELECT 1 FROM dlock_leases WHERE key = $1 FOR UPDATE`, key)
		}
		var pid int
		if err == nil {
			err = tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid)
		}
		if err != nil {
			bumps <- err
			return
		}
		go func() {
			bumps <- func() error {
				defer tx.Rollback(context.Background())
				for i := 0; ; i++ { // until the statement waits on the admin's lock
					var n int
					if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, pid).Scan(&n); err != nil {
						return err
					}
					if n > 0 {
						break
					}
					if i == 10000 {
						return errors.New("the attempt never waited on the row's lock")
					}
					time.Sleep(time.Millisecond)
				}
				if _, err := tx.Exec(ctx, `UPDATE dlock_leases SET gen = gen + 1 WHERE key = $1`, key); err != nil {
					return err
				}
				return tx.Commit(ctx)
			}()
		}()
	}
	return tr, bumps
}

// wantChanges receives the outcome of each of the n changes tr started.
func wantChanges(t *testing.T, tr *churnTracer, bumps <-chan error, n int) {
	t.Helper()
	if got := int(tr.changes.Load()); got != n {
		t.Fatalf("the row changed %d times under the attempt, want %d", got, n)
	}
	for range n {
		select {
		case err := <-bumps:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(dlocktest.HangTimeout):
			t.Fatal("hang: a change of the row never ended")
		}
	}
}

// tracedPool is a pool on dsn whose statements tr traces.
func tracedPool(t *testing.T, dsn string, tr pgx.QueryTracer) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// churnTracer calls onStart before each statement of its pool while on.
type churnTracer struct {
	on      atomic.Bool
	onStart func(ctx context.Context, sql string, inTx bool)
	changes atomic.Int32 // changes of the row started (changeRowUnder)
}

func (c *churnTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if c.on.Load() {
		c.onStart(context.WithoutCancel(ctx), data.SQL, conn.PgConn().TxStatus() != 'I')
	}
	return ctx
}

func (c *churnTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
