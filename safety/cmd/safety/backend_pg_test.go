package main

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// dsnAt moves a DSN to a worker's fault proxy and keeps the rest: the
// user, the database and the parameters (PgBouncer's DSN turns pgx's
// statement cache off; losing that would break the pgbouncer rows).
func TestDSNAt(t *testing.T) {
	h := &tb{root: t.TempDir()}
	defer h.close()
	got := dsnAt(h, "postgres://dlock@127.0.0.1:5432/postgres?sslmode=disable&default_query_exec_mode=exec", "127.0.0.1:6000")
	u, err := url.Parse(got)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	if u.Host != "127.0.0.1:6000" || u.User.Username() != "dlock" || u.Path != "/postgres" ||
		q.Get("sslmode") != "disable" || q.Get("default_query_exec_mode") != "exec" {
		t.Fatalf("dsnAt: %s", got)
	}
}

// Every PostgreSQL deployment gives each worker a spec openLocker takes,
// that locks on the deployment's server: direct, through a fault proxy
// per worker (partition-client, lost-replies) and through PgBouncer.
// Tokens increase from one worker's grant to the next's (one sequence).
func TestPgDeployments(t *testing.T) {
	for _, c := range []caseSpec{
		{backend: "pg", fault: "none", ttl: time.Second},
		{backend: "pg", fault: "lost-replies", ttl: time.Second},
		{backend: "pgbouncer", fault: "client-pause", ttl: time.Second},
	} {
		t.Run(c.name(), func(t *testing.T) {
			h := &tb{root: t.TempDir()}
			defer h.close()
			const workers = 2
			d := deploy(h, c, workers)
			if len(d.specs) != workers || d.pg == nil {
				t.Fatalf("specs %q, postgres %v", d.specs, d.pg)
			}
			proxies := 0
			if c.fault == "lost-replies" {
				proxies = workers // one per worker
			}
			if len(d.proxies) != proxies {
				t.Fatalf("%d fault proxies, want %d", len(d.proxies), proxies)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var last uint64
			for i, spec := range d.specs {
				l, closeLocker, err := openLocker(spec)
				if err != nil {
					t.Fatalf("worker %d: openLocker(%q): %v", i, spec, err)
				}
				lk, err := l.Acquire(ctx, "safety/register", dlock.WithTTL(c.ttl))
				if err != nil {
					closeLocker()
					t.Fatalf("worker %d: acquire: %v", i, err)
				}
				if tok := lk.Fence().Token; tok <= last {
					t.Errorf("worker %d: token %d after %d", i, tok, last)
				} else {
					last = tok
				}
				if err := lk.Release(ctx); err != nil {
					t.Errorf("worker %d: release: %v", i, err)
				}
				closeLocker()
			}
		})
	}
}

// openLocker refuses a pg spec whose DSN pgxpool cannot parse.
func TestOpenLockerBadPgDSN(t *testing.T) {
	if _, _, err := openLocker("pg:postgres://dlock@127.0.0.1:notaport/postgres"); err == nil {
		t.Fatal("a DSN with a bad port was accepted")
	}
}
