package main

import (
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"

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
