package main

import (
	"context"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/examples/internal/harness"
	"github.com/dlock-go/dlock/internal/testserver"
)

func TestMain(m *testing.M) {
	harness.RunChild(children) // the paused buyer: this test binary, re-executed
	testserver.Main(m)
}

// TestInventory runs the three scenarios on real servers, the paused
// buyer a real stopped process, and checks each outcome in the database.
func TestInventory(t *testing.T) {
	e := env{
		redis: testserver.StartRedis(t).Addr(),
		pg:    testserver.StartPostgres(t).DSN(""),
		run:   newRunID(),
	}
	for _, sc := range scenarios {
		r, err := runScenario(context.Background(), e, sc, t.Logf)
		if err != nil {
			t.Fatalf("%s: %v", sc.name, err)
		}
		t.Logf("%s: %s", sc.name, r.invariantLine(sc))
		switch {
		case !sc.pause:
			if len(r.Problems) > 0 {
				t.Errorf("%s: invariant broken: %v", sc.name, r.Problems)
			}
			if r.Sold != r.Start || r.Left != 0 || r.turnedAway != buyers-r.Start {
				t.Errorf("%s: sold %d, left %d, %d turned away; want every item sold and %d turned away", sc.name, r.Sold, r.Left, r.turnedAway, buyers-r.Start)
			}
		case sc.fenced:
			if len(r.Problems) > 0 {
				t.Errorf("%s: invariant broken: %v", sc.name, r.Problems)
			}
			if !r.pausedRejected || !strings.Contains(r.pausedSaid, "stale fencing token") {
				t.Errorf("%s: the paused buyer's stale write was not rejected: it said %q", sc.name, r.pausedSaid)
			}
			if r.Sold != r.Start {
				t.Errorf("%s: sold %d, want %d", sc.name, r.Sold, r.Start)
			}
		default: // the negative control
			if !r.pausedWrote {
				t.Fatalf("%s: the paused buyer's write did not go through: it said %q", sc.name, r.pausedSaid)
			}
			// Its stale stock read (5) let it take a unit of a SKU the
			// others had sold out: one unit oversold, stock at -1.
			want := []string{"sku-0: stock -1", "sku-0: 6 sold of 5"}
			if strings.Join(r.Problems, "; ") != strings.Join(want, "; ") {
				t.Errorf("%s: violations %q, want %q", sc.name, r.Problems, want)
			}
		}
	}
}
