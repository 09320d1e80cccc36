package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock/etcdtest"
	"github.com/dlock-go/dlock/examples/internal/harness"
	"github.com/dlock-go/dlock/internal/testserver"
)

func TestMain(m *testing.M) {
	harness.RunChild(children) // the paused worker: this test binary, re-executed
	testserver.Main(m,
		// Process-wide singletons of the embedded etcd server and gRPC.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
	)
}

// TestTransfer runs both scenarios on real servers (embedded etcd,
// PostgreSQL), the paused worker a real stopped process, and audits the
// books: fenced, the stale transfer is rejected and the invariant holds;
// with the locks alone, the transfer is carried out twice and the sum
// changes by its stale write (the negative control).
func TestTransfer(t *testing.T) {
	e := env{
		Etcd:     etcdtest.Start(t, 1).Endpoints()[0],
		Postgres: testserver.StartPostgres(t).DSN(""),
		Run:      newRunID(),
	}
	for _, fenced := range []bool{true, false} {
		r, err := runScenario(context.Background(), e, fenced, t.Logf)
		if err != nil {
			t.Fatalf("%s: %v", scenarioName(fenced), err)
		}
		t.Logf("%s: %s", scenarioName(fenced), r.invariantLine(fenced))
		if fenced {
			for _, p := range r.Problems {
				t.Errorf("fenced: %s", p)
			}
			if !r.pausedRejected || !strings.Contains(r.pausedSaid, "stale fencing token") {
				t.Errorf("fenced: the paused worker's stale transfer was not rejected: it said %q", r.pausedSaid)
			}
			if r.Applied+r.Declined != transfers {
				t.Errorf("fenced: the ledger has %d transfers, want %d", r.Applied+r.Declined, transfers)
			}
			continue
		}
		if !r.pausedApplied {
			t.Fatalf("locks only: the paused worker's transfer did not go through: it said %q", r.pausedSaid)
		}
		// W wrote acct-0 = 1000-100 and acct-1 = 1000+100 from its stale
		// reads: transfer #0 twice in the ledger, and #1's 50 out of acct-0
		// undone, so the sum grew by 50.
		if r.Sum != r.Want+50 {
			t.Errorf("locks only: sum %d, want %d (the negative control)", r.Sum, r.Want+50)
		}
		if !strings.Contains(strings.Join(r.Problems, "; "), "transfer #0 carried out 2 times") {
			t.Errorf("locks only: problems %q do not show transfer #0 carried out twice", r.Problems)
		}
	}
}

// A transfer whose lock was lost before its write (renewals starved on a
// loaded host) ended the whole program with an error: it starts over and
// is applied once, and the lost lock wrote nothing.
func TestApply_StartsOverWhenALockIsLostBeforeTheWrite(t *testing.T) {
	ctx := context.Background()
	b, err := openBank(ctx, etcdtest.Start(t, 1).Endpoints()[0], testserver.StartPostgres(t).DSN(""), newRunID(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	if err := b.open(ctx); err != nil {
		t.Fatal(err)
	}
	reads := 0
	b.afterRead = func(h held) {
		if reads++; reads > 1 {
			return
		}
		// The second account's lock is broken behind the transfer's back.
		if _, err := dlock.Break(ctx, b.locker, b.key(h.ids[1]), ""); err != nil {
			t.Error(err)
		}
		select {
		case <-h.locks[1].Lost():
		case <-time.After(dlocktest.HangTimeout):
			t.Error("hang: the broken lock was never lost")
		}
	}
	tr := transfer{ID: 0, From: 0, To: 1, Amount: 1}
	out, err := b.apply(ctx, tr, nil)
	if err != nil || out != applied {
		t.Fatalf("apply after a lock was lost before the write: outcome %d, %v; want applied", out, err)
	}
	if reads != 2 {
		t.Errorf("the transfer read the balances %d times, want 2 (a start over)", reads)
	}
	bk, err := b.audit(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if bk.Applied != 1 || len(bk.Problems) > 0 {
		t.Errorf("books: %d applied, problems %v; want the transfer applied once", bk.Applied, bk.Problems)
	}
}
