package pglock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/pglock"
)

// The read-first acquire statement in every pgx exec mode (its
// parameters appear more than once; the simple protocol interpolates
// them), with a key and metadata full of quotes, backslashes and
// placeholders: acquire, a failed attempt reporting the holder and its
// metadata, release, takeover.
func TestRedTeam_AcquireExecModes(t *testing.T) {
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

// A lease expired by the database's clock, taken over by many contenders
// at once (several Lockers, one attempt each, started together): exactly
// one wins, with a token above the expired lease's, each round.
func TestRedTeam_ExpiredTakeoverStampede(t *testing.T) {
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
