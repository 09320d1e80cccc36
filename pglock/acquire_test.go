package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
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

// The read-first acquire statement in every pgx exec mode (its
// parameters appear more than once; the simple protocol interpolates
// them), with a key and metadata full of quotes, backslashes and
// placeholders: acquire, a failed attempt reporting the holder and its
// metadata, release, takeover.
func TestAcquire_EveryExecModeWithQuotesAndPlaceholders(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	for _, mode := range []string{"simple_protocol", "exec", "describe_exec", "cache_describe", "cache_statement"} {
		t.Run(mode, func(t *testing.T) {
			ctx := dlocktest.Context(t)
			dsn := pg.DSN("") + "&default_query_exec_mode=" + mode
			a := pglock.New(newPool(t, dsn))
			b := pglock.New(newPool(t, dsn))
			key := dlocktest.Key(t) + `'";\ $1 $2 -- /*`
			md := map[string]string{`k'$3\`: `v"$4 -- '`}
			lk, err := a.Acquire(ctx, key, dlock.WithMetadata(`k'$3\`, md[`k'$3\`]))
			if err != nil {
				t.Fatal(err)
			}
			_, err = b.TryAcquire(ctx, key)
			var na *dlock.NotAcquiredError
			if !errors.As(err, &na) || len(na.Holders) != 1 || na.Holders[0].Token != lk.Token() || na.Holders[0].Metadata[`k'$3\`] != md[`k'$3\`] {
				t.Fatalf("attempt on the held key: %v %+v", err, na)
			}
			if err := lk.Release(ctx); err != nil {
				t.Fatal(err)
			}
			lk2, err := b.TryAcquire(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if lk2.Token() <= lk.Token() {
				t.Errorf("takeover token %d after %d", lk2.Token(), lk.Token())
			}
			if err := lk2.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Metadata is stored as jsonb, which cannot hold "\u0000": metadata with a
// NUL byte (valid UTF-8, accepted by the core) is refused before anything
// is sent, with an error wrapping dlock.ErrInvalidOption; other odd
// characters round-trip.
// Symptom: such metadata failed on the server with "unsupported Unicode escape sequence (SQLSTATE 22P05)".
func TestAcquire_RefusesNULMetadata_OddBytesRoundTrip(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	l := pglock.New(newPool(t, pg.DSN("")))
	key := dlocktest.Key(t)
	for name, md := range map[string][2]string{
		"NUL in value": {"k", "x\x00y"},
		"NUL in name":  {"k\x00", "v"},
	} {
		_, err := l.TryAcquire(dlocktest.Context(t), key, dlock.WithMetadata(md[0], md[1]))
		if !errors.Is(err, dlock.ErrInvalidOption) || !strings.Contains(err.Error(), "NUL") {
			t.Errorf("%s: TryAcquire = %v, want ErrInvalidOption naming the NUL byte", name, err)
		}
	}
	odd := "\x01\x7f\"\\'\u2028\U0001F512\ufffd{}[]$1%_"
	lk, err := l.TryAcquire(dlocktest.Context(t), key, dlock.WithMetadata(odd, odd))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	infos, err := l.List(dlocktest.Context(t), key)
	if err != nil || len(infos) != 1 {
		t.Fatalf("List: %v %v", infos, err)
	}
	if got := infos[0].Holders[0].Metadata[odd]; got != odd {
		t.Fatalf("metadata read back as %q, want %q", got, odd)
	}
	_, err = l.TryAcquire(dlocktest.Context(t), key)
	var na *dlock.NotAcquiredError
	if !errors.As(err, &na) || len(na.Holders) != 1 || na.Holders[0].Metadata[odd] != odd {
		t.Fatalf("the holder as a contender sees it: %v", err)
	}
}

// Expiry is judged by the database's clock alone: no client timestamp is
// ever written or compared. The test moves a lease's expiry as the
// database sees it (the same as the database's clock moving against the
// clients') and checks that contenders follow the database, not the
// holder's or their own clock: a lease the database has passed is taken
// over although its holder's local deadline is an hour away, and a lease
// in the database's future is not, however long ago its TTL ran out on
// the contender's clock.
func TestExpiryByDatabaseClock(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	ctx := dlocktest.Context(t)
	a := pglock.New(newPool(t, pg.DSN("")))
	bPool := newPool(t, pg.DSN(""))
	b := pglock.New(bPool)
	key := dlocktest.Key(t)

	lk, err := a.Acquire(ctx, key, dlock.WithTTL(time.Hour), dlock.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	// The lease was computed by the server: its expiry is the server's
	// clock plus the TTL.
	left, err := pg.Exec("", "SELECT (extract(epoch FROM expires_at - clock_timestamp()) BETWEEN 3000 AND 3600)::text FROM dlock_leases WHERE key = '"+escape(key)+"'")
	if err != nil || left != "true" {
		t.Fatalf("expires_at - server clock within (50m, 1h]: %q %v", left, err)
	}

	// The database's clock passes the lease: the key is free for b at once,
	// although a's local deadline is an hour away.
	if _, err := pg.Exec("", "UPDATE dlock_leases SET expires_at = clock_timestamp() - interval '1 millisecond' WHERE key = '"+escape(key)+"'"); err != nil {
		t.Fatal(err)
	}
	lb, err := b.TryAcquire(ctx, key, dlock.WithTTL(time.Second), dlock.WithAutoRefresh(false))
	if err != nil {
		t.Fatalf("lease expired by the database's clock not taken over: %v", err)
	}
	if lb.Token() <= lk.Token() {
		t.Errorf("takeover token %d not above %d", lb.Token(), lk.Token())
	}
	if err := lk.Refresh(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Errorf("old holder's Refresh after the takeover = %v, want ErrLockLost", err)
	}

	// b dies holding the key (its pool is gone, so nothing it does reaches
	// the server), and its lease lies in the database's future: b's 1s TTL
	// has long run out on every client's clock, but not on the database's.
	bPool.Close()
	if _, err := pg.Exec("", "UPDATE dlock_leases SET expires_at = clock_timestamp() + interval '1 hour' WHERE key = '"+escape(key)+"'"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // past b's TTL by any client clock
	if _, err := a.TryAcquire(ctx, key, dlock.WithTTL(time.Second)); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Errorf("lease live by the database's clock taken: %v", err)
	}
}

// A lease expired by the database's clock, taken over by many contenders
// at once (several Lockers, one attempt each, started together): exactly
// one wins, with a token above the expired lease's, each round.
func TestAcquire_ExpiredLeaseStampedeHasOneWinner(t *testing.T) {
	t.Parallel()
	pg := ownPG(t)
	pb := bouncerFor(t, pg)
	for _, tc := range []struct{ name, dsn string }{{"direct", pg.DSN("")}, {"pgbouncer", pb.DSN("")}} {
		t.Run(tc.name, func(t *testing.T) {
			var ls []*pglock.Locker
			for i := 0; i < 4; i++ {
				ls = append(ls, pglock.New(newPool(t, tc.dsn)))
			}
			key := dlocktest.Key(t)
			for round := 0; round < 8; round++ {
				ctx := dlocktest.Context(t)
				seed, err := ls[0].Acquire(ctx, key, dlock.WithTTL(time.Second))
				if err != nil {
					t.Fatal(err)
				}
				// Expire it by the database's clock, behind its holder.
				if _, err := pg.Exec("", "UPDATE dlock_leases SET expires_at = clock_timestamp() - interval '1 second' WHERE key = '"+escape(key)+"'"); err != nil {
					t.Fatal(err)
				}
				start := make(chan struct{})
				type res struct {
					lk  *dlock.Lock
					err error
				}
				out := make(chan res, 16)
				for i := 0; i < 16; i++ {
					l := ls[i%len(ls)]
					go func() {
						<-start
						lk, err := l.TryAcquire(ctx, key)
						out <- res{lk, err}
					}()
				}
				close(start)
				var won []*dlock.Lock
				for i := 0; i < 16; i++ {
					r := <-out
					switch {
					case r.err == nil:
						won = append(won, r.lk)
					case !errors.Is(r.err, dlock.ErrNotAcquired):
						t.Errorf("round %d: %v", round, r.err)
					}
				}
				if len(won) != 1 {
					t.Fatalf("round %d: %d winners of an expired lease", round, len(won))
				}
				if won[0].Token() <= seed.Token() {
					t.Errorf("round %d: token %d after the expired lease's %d", round, won[0].Token(), seed.Token())
				}
				select {
				case <-seed.Lost():
				case <-ctx.Done():
					t.Fatal("the expired holder never saw its loss")
				}
				seed.Release(ctx)
				if err := won[0].Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// The read-first acquire statement under racing contenders (several
// goroutines on each of several Lockers, direct and through PgBouncer):
// fresh keys each round, so first inserts race; then each key is
// released and taken over by the racing rest. Never two holders at once,
// and a key's tokens increase in the order it is granted.
func TestAcquire_RacingContendersKeepOneHolderAndTokenOrder(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	pb := bouncerFor(t, pg)
	for _, tc := range []struct{ name, dsn string }{{"direct", pg.DSN("")}, {"pgbouncer", pb.DSN("")}} {
		t.Run(tc.name, func(t *testing.T) {
			var lockers []*pglock.Locker
			for i := 0; i < 4; i++ {
				lockers = append(lockers, pglock.New(newPool(t, tc.dsn)))
			}
			var granted atomic.Int64
			for round := 0; round < 4; round++ {
				ctx := dlocktest.Context(t)
				keys := []string{dlocktest.Key(t) + fmt.Sprint(round, "a"), dlocktest.Key(t) + fmt.Sprint(round, "b")}
				type keyState struct {
					mu     sync.Mutex
					held   bool
					last   uint64
					grants int
				}
				st := map[string]*keyState{}
				for _, k := range keys {
					st[k] = &keyState{}
				}
				var wg sync.WaitGroup
				for li, l := range lockers {
					for g := 0; g < 4; g++ {
						wg.Add(1)
						go func() {
							defer wg.Done()
							for i := 0; i < 3; i++ {
								k := keys[(li+g+i)%len(keys)]
								var lk *dlock.Lock
								var err error
								if (g+i)%2 == 0 {
									lk, err = l.Acquire(ctx, k, dlock.WithBackoff(dlock.ConstBackoff{Delay: 5 * time.Millisecond}))
								} else {
									lk, err = l.TryAcquire(ctx, k)
									if errors.Is(err, dlock.ErrNotAcquired) {
										continue
									}
								}
								if err != nil {
									t.Errorf("acquire %s: %v", k, err)
									return
								}
								s := st[k]
								s.mu.Lock()
								if s.held {
									t.Errorf("%s granted (token %d) while held", k, lk.Token())
								}
								if lk.Token() <= s.last {
									t.Errorf("%s: token %d granted after token %d", k, lk.Token(), s.last)
								}
								s.held, s.last = true, lk.Token()
								s.grants++
								s.mu.Unlock()
								granted.Add(1)
								time.Sleep(time.Millisecond)
								s.mu.Lock()
								s.held = false
								s.mu.Unlock()
								if err := lk.Release(ctx); err != nil {
									t.Errorf("release %s: %v", k, err)
									return
								}
							}
						}()
					}
				}
				wg.Wait()
				if t.Failed() {
					return
				}
			}
			t.Logf("%d grants", granted.Load())
		})
	}
}

// Racing takeovers: lockers on separate pools take one key in turn, some
// releasing, some abandoning the lock to expire (a takeover of an expired
// row), directly and through PgBouncer with default pools. While a lock
// is still valid (Err nil, checked under the test's mutex), its token must
// be above every token granted before it: a later grant can only come
// after its Lost() closed.
func TestAcquire_TokensIncreaseUnderRacingTakeovers(t *testing.T) {
	t.Parallel()
	pg := ownPG(t)
	pb := bouncerFor(t, pg)
	for name, dsn := range map[string]string{
		"direct":    pg.DSN(""),
		"pgbouncer": strings.Replace(pb.DSN(""), "&default_query_exec_mode=exec", "", 1),
	} {
		t.Run(name, func(t *testing.T) {
			key := dlocktest.Key(t)
			var (
				mu      sync.Mutex
				last    uint64
				checked int
			)
			var wg sync.WaitGroup
			errs := make(chan error, 64)
			for g := 0; g < 6; g++ {
				l := pglock.New(newPool(t, dsn))
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 8; i++ {
						lk, err := l.Acquire(dlocktest.Context(t), key, dlock.WithTTL(300*time.Millisecond), dlock.WithAutoRefresh(false))
						if err != nil {
							errs <- err
							return
						}
						mu.Lock()
						if lk.Err() == nil {
							if lk.Token() <= last {
								errs <- fmt.Errorf("token %d granted after %d", lk.Token(), last)
							}
							last = lk.Token()
							checked++
						}
						mu.Unlock()
						if (g+i)%3 != 0 {
							_ = lk.Release(dlocktest.Context(t))
						} else {
							<-lk.Lost() // abandoned: the next grant is a takeover of the expired row
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			t.Logf("%d grants checked, last token %d", checked, last)
		})
	}
}

// Many waiters on one key sharing a pool of two connections (and the
// LISTEN connection taken out of it): every one gets the key in turn, and
// the holders' releases are not starved of connections.
func TestWaitersOnSmallPool_TwentyAllServed(t *testing.T) {
	t.Parallel()
	waitersOnSmallPool(t, 20)
}

// The same with a hundred waiters.
//
// Long: a hundred waiters take turns on two connections, over 25s under
// the race detector on a loaded 2-core machine, where a waiter's wait
// for a connection can outlast its request timeout.
func TestWaitersOnSmallPool_HundredAllServed(t *testing.T) {
	testserver.Long(t, "a scale variant: a hundred waiters take turns on two connections")
	t.Parallel()
	waitersOnSmallPool(t, 100)
}

// waitersOnSmallPool has n waiters acquire and release one key through
// one Locker on a pool of two connections.
func waitersOnSmallPool(t *testing.T, n int) {
	pg := ownPG(t)
	pool := newPool(t, pg.DSN("")+"&pool_max_conns=2")
	l := pglock.New(pool)
	key := dlocktest.Key(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*dlocktest.HangTimeout)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lk, err := l.Acquire(ctx, key)
			if err != nil {
				errs <- err
				return
			}
			if err := lk.Release(ctx); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// A writer's TryAcquire right after the last reader released takes the
// key although a renewal of that reader, in flight across the release,
// bumps the key row's gen between the writer's snapshot and its upsert.
// Once: the plain retry takes the key; three times: the read under the
// row's lock does.
// Symptom: the writer was refused, naming no holder.
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

// A contender that stalls inside the transaction holding the key row's
// lock (a paused process, a cut link) loses the lock: the server ends
// such a transaction after the request timeout, and another client takes
// the key.
// Symptom: the stalled contender kept the key, and every renewal of its holder, waiting until its connection died.
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
