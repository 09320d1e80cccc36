package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
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

// A buyer whose lock was lost before its write (renewals starved on a
// loaded host) ended the whole program with an error: it starts over and
// buys, and the lost lock wrote nothing.
func TestBuy_StartsOverWhenTheLockIsLostBeforeTheWrite(t *testing.T) {
	ctx := context.Background()
	s, err := openShop(ctx, testserver.StartRedis(t).Addr(), testserver.StartPostgres(t).DSN(""), newRunID(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if err := s.stockUp(ctx); err != nil {
		t.Fatal(err)
	}
	reads := 0
	s.afterRead = func(lk *dlock.Lock) {
		if reads++; reads > 1 {
			return
		}
		// The first lock is broken behind the buyer's back.
		if _, err := dlock.Break(ctx, s.locker, s.key(skuName(0)), ""); err != nil {
			t.Error(err)
		}
		select {
		case <-lk.Lost():
		case <-time.After(dlocktest.HangTimeout):
			t.Error("hang: the lock whose key was deleted was never lost")
		}
	}
	out, err := s.buy(ctx, 0, skuName(0), nil)
	if err != nil || out != bought {
		t.Fatalf("buy after the first lock was lost before the write: outcome %d, %v; want bought", out, err)
	}
	if reads != 2 {
		t.Errorf("the buyer read the stock %d times, want 2 (a start over)", reads)
	}
	tl, err := s.count(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if tl.Sold != 1 || tl.Left != tl.Start-1 || len(tl.Problems) > 0 {
		t.Errorf("sold %d, left %d of %d, problems %v; want one unit sold", tl.Sold, tl.Left, tl.Start, tl.Problems)
	}
}
