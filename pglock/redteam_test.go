package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/pglock"
)

// A long schema-qualified table name that WithTable accepts (two parts of
// up to 48 bytes) made a NOTIFY channel name over PostgreSQL's 63 bytes:
// every Release failed with "channel name too long", so locks were only
// freed by expiry, and the waiters' LISTEN (truncated by the server) never
// matched.
func TestRedTeam_LongTableNameRelease(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	schema, table := strings.Repeat("s", 48), strings.Repeat("t", 48)
	if _, err := pg.Exec("", "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	opts := []pglock.Option{pglock.WithTable(schema + "." + table)}
	key := dlocktest.Key(t)
	holder, err := pglock.New(newPool(t, pg.DSN("")), opts...).Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	// A waiter whose poll is a minute: only the release's NOTIFY wakes it
	// within the test's bound.
	waiter := pglock.New(newPool(t, pg.DSN("")), opts...)
	got := acquireLater(dlocktest.Context(t), waiter, key, time.Minute)
	waitListening(t, pg)
	if err := holder.Release(dlocktest.Context(t)); err != nil {
		t.Fatalf("Release with table %s.%s: %v", schema, table, err)
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

// Behind PgBouncer in transaction pooling mode with pgx's default
// configuration (its statement cache prepares named statements on the
// server connection, which the pooler hands to other clients): acquires,
// releases, lists and migrations failed with "prepared statement
// stmtcache_... already exists" (or "does not exist") most of the time,
// while the package doc promised "no prepared statement kept". pglock now
// runs its statements without the statement cache.
func TestRedTeam_PgBouncerDefaultPool(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	pb := bouncerFor(t, pg)
	dsn := strings.Replace(pb.DSN(""), "&default_query_exec_mode=exec", "", 1)
	if dsn == pb.DSN("") {
		t.Fatalf("cannot make a default DSN from %s", dsn)
	}
	const nPools = 4
	var lockers []*pglock.Locker
	for i := 0; i < nPools; i++ {
		p := newPool(t, dsn)
		if p.Config().ConnConfig.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
			t.Fatalf("pool %d is not pgx's default configuration", i)
		}
		lockers = append(lockers, pglock.New(p))
		if err := pglock.Migrate(dlocktest.Context(t), p); err != nil {
			t.Fatalf("Migrate through PgBouncer with a default pool: %v", err)
		}
	}
	key := dlocktest.Key(t)
	var last uint64
	for i := 0; i < 40; i++ {
		l := lockers[i%nPools]
		lk, err := l.Acquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatalf("cycle %d: Acquire through PgBouncer with a default pool: %v", i, err)
		}
		if lk.Token() <= last {
			t.Fatalf("cycle %d: token %d after %d", i, lk.Token(), last)
		}
		last = lk.Token()
		if err := lk.Refresh(dlocktest.Context(t)); err != nil {
			t.Fatalf("cycle %d: Refresh: %v", i, err)
		}
		if _, err := lockers[(i+1)%nPools].List(dlocktest.Context(t), key); err != nil {
			t.Fatalf("cycle %d: List: %v", i, err)
		}
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Fatalf("cycle %d: Release: %v", i, err)
		}
	}
}

// The least-privilege setup: the lease table made by an administrator
// (pglock.Migrate), the application's role allowed only to use it. A
// default Locker (migration on first use) failed every call with
// "permission denied for schema public" (PostgreSQL 15's default: only
// the owner may create in public), because its migration ran CREATE TABLE
// IF NOT EXISTS, which needs the privilege to create even when the table
// exists; the error said the user "may not use the lease table".
func TestRedTeam_LeastPrivilegeUser(t *testing.T) {
	t.Parallel()
	pg := ownPG(t)
	if err := pglock.Migrate(dlocktest.Context(t), newPool(t, pg.DSN(""))); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		"CREATE ROLE app LOGIN PASSWORD 'pw'",
		"REVOKE CREATE ON SCHEMA public FROM PUBLIC",
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
	l := pglock.New(newPool(t, app))
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatalf("Acquire as a role that may only use the lease table: %v", err)
	}
	if infos, err := l.List(dlocktest.Context(t), key); err != nil || len(infos) != 1 {
		t.Fatalf("List: %v %v", infos, err)
	}
	// Shared and limited holders and waiting writers use the holders and
	// writers tables: the same role, with the grants above.
	for _, opt := range []dlock.Option{dlock.WithShared(), dlock.WithLimit(2)} {
		r, err := l.Acquire(dlocktest.Context(t), key+"/m", opt)
		if err != nil {
			t.Fatalf("Acquire %v as the least-privilege role: %v", opt, err)
		}
		if err := r.Release(dlocktest.Context(t)); err != nil {
			t.Fatal(err)
		}
	}
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	// Without the table, the same role is told to run Migrate as a role
	// that may create it.
	_, err = pglock.New(newPool(t, app), pglock.WithTable("other")).TryAcquire(dlocktest.Context(t), key)
	if err == nil || !strings.Contains(err.Error(), "pglock.Migrate") {
		t.Fatalf("no table and no privilege to create it: %v, want an error naming pglock.Migrate", err)
	}
	t.Logf("no table, no privilege: %v", err)
}

// Metadata is stored as jsonb, which cannot hold "\u0000": metadata with a
// NUL byte (valid UTF-8, accepted by the core) failed with the server's
// "unsupported Unicode escape sequence (SQLSTATE 22P05)". It is now refused
// before anything is sent, with an error wrapping dlock.ErrInvalidOption;
// other odd characters round-trip.
func TestRedTeam_MetadataOddBytes(t *testing.T) {
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

// A nil transaction of a concrete type in the pgx.Tx interface (a
// *pgxpool.Tx left nil by a failed Begin) passed the nil check of
// Guard.Check and panicked with a nil pointer dereference.
func TestRedTeam_GuardTypedNilTx(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	g := pglock.NewGuard(newPool(t, pg.DSN("")))
	var tx *pgxpool.Tx
	err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("Guard.Check panicked on a nil *pgxpool.Tx: %v", r)
			}
		}()
		return g.Check(dlocktest.Context(t), tx, "r", dlock.Fence{Token: 1, Owner: "o"})
	}()
	if !errors.Is(err, dlock.ErrInvalidOption) {
		t.Fatalf("Check(nil *pgxpool.Tx) = %v, want ErrInvalidOption", err)
	}
}

// List with a prefix PostgreSQL's text cannot hold (a NUL byte, invalid
// UTF-8) failed with the server's "invalid byte sequence for encoding"
// error after a round trip; it is now refused up front with an error
// wrapping dlock.ErrInvalidKey. A huge prefix is simply no match.
func TestRedTeam_ListOddPrefix(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	l := pglock.New(newPool(t, pg.DSN("")))
	for _, p := range []string{"a\x00", "\xff", "a\xc3"} {
		if _, err := l.List(dlocktest.Context(t), p); !errors.Is(err, dlock.ErrInvalidKey) {
			t.Errorf("List(%q) = %v, want ErrInvalidKey", p, err)
		}
	}
	if infos, err := l.List(dlocktest.Context(t), strings.Repeat("é", 1<<16)); err != nil || len(infos) != 0 {
		t.Errorf("List(huge prefix) = %v, %v", infos, err)
	}
}

// Racing takeovers: lockers on separate pools take one key in turn, some
// releasing, some abandoning the lock to expire (a takeover of an expired
// row), directly and through PgBouncer with default pools. While a lock
// is still valid (Err nil, checked under the test's mutex), its token must
// be above every token granted before it: a later grant can only come
// after its Lost() closed. Passed: kept as a regression test.
func TestRedTeam_TokensUnderRacingTakeovers(t *testing.T) {
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
func TestRedTeam_ManyWaitersSmallPool(t *testing.T) {
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
