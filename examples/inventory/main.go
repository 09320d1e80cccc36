// Command inventory is a case study of dlock: 50 buyers race for 20 items
// (4 SKUs × 5 units). Each purchase reads the SKU's stock and takes a unit
// under a Redis lock on the SKU (redislock); the stock is a row in
// PostgreSQL. One buyer is a separate process that stops itself (SIGSTOP)
// inside its critical section, after its last check of the lock and past
// its lease, while the other buyers sell the SKU out. When it continues:
//
//   - fenced (pglock.Guard checks the lock's token inside the UPDATE's
//     transaction), its write is rejected and the stock stays right;
//   - with the lock alone, its write goes through: the SKU is oversold and
//     its stock goes below zero.
//
// Usage:
//
//	go run ./inventory [-redis host:port] [-pg postgres://...]
//
// With no flags it starts redis-server and PostgreSQL itself (`make deps`
// installs them). It exits 1 if an invariant that must hold does not, or
// if the unfenced run shows no violation.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/examples/internal/harness"
)

// children are the roles this binary runs in when re-executed.
var children = map[string]func([]byte) error{"buyer": pausedBuyer}

func main() {
	harness.RunChild(children)
	redisAddr := flag.String("redis", "", "Redis `host:port` (default: start a redis-server)")
	pgURL := flag.String("pg", "", "PostgreSQL `URL` (default: start a PostgreSQL server)")
	flag.Parse()
	harness.Main("inventory", func(ctx context.Context, p *harness.Program) error {
		env := env{redis: harness.Redis(p, *redisAddr), pg: harness.Postgres(p, *pgURL), run: newRunID()}
		fmt.Printf("inventory: %d buyers, %d items (%d SKUs × %d), a Redis lock per SKU (redislock, %v lease), the stock in PostgreSQL\n",
			buyers, skus*perSKU, skus, perSKU, lockTTL)
		ok := true
		for _, sc := range scenarios {
			fmt.Printf("[%s]\n", sc.name)
			r, err := runScenario(ctx, env, sc, func(format string, args ...any) { fmt.Printf("  "+format+"\n", args...) })
			if err != nil {
				return fmt.Errorf("%s: %w", sc.name, err)
			}
			fmt.Println("  " + r.invariantLine(sc))
			ok = ok && r.asExpected(sc)
		}
		if !ok {
			return errors.New("FAIL: an outcome was not the expected one")
		}
		fmt.Println("inventory: ok: fenced, the paused buyer's write was rejected; with the lock alone it oversold")
		return nil
	})
}

// buyers is how many buyers race, each for one unit.
const buyers = 50

// env is where a run's servers are, and the run's name.
type env struct{ redis, pg, run string }

func newRunID() string { return fmt.Sprintf("%06x", rand.Uint32()&0xffffff) }

// scenario is one run of the shop.
type scenario struct {
	name   string
	fenced bool // the guard checks the lock's token in the transactions
	pause  bool // buyer 0 is a process that stops before its write
}

var scenarios = []scenario{
	{name: "lock only, nobody paused", fenced: false, pause: false},
	{name: "fenced, buyer 0 paused", fenced: true, pause: true},
	{name: "lock only, buyer 0 paused", fenced: false, pause: true},
}

// result is the outcome of a scenario.
type result struct {
	tally
	turnedAway int
	// The paused buyer's write: rejected by the guard (with the error it
	// printed) or accepted.
	pausedRejected bool
	pausedWrote    bool
	pausedSaid     string
}

// invariantLine is the scenario's verdict.
func (r result) invariantLine(sc scenario) string {
	inv := fmt.Sprintf("invariant (stock ≥ 0, sold ≤ stocked, sold + left = %d):", r.Start)
	switch {
	case len(r.Problems) == 0 && r.pausedRejected:
		return inv + " holds; 1 stale write rejected"
	case len(r.Problems) == 0:
		return inv + " holds"
	case !sc.fenced && sc.pause:
		return inv + " VIOLATED: " + strings.Join(r.Problems, "; ") + " (expected: the negative control)"
	default:
		return inv + " VIOLATED: " + strings.Join(r.Problems, "; ")
	}
}

// asExpected: the invariant holds except in the unfenced run with a
// pause, which must break it; fenced, the paused buyer must be rejected.
func (r result) asExpected(sc scenario) bool {
	switch {
	case sc.pause && !sc.fenced:
		return len(r.Problems) > 0 && r.pausedWrote
	case sc.pause:
		return len(r.Problems) == 0 && r.pausedRejected
	default:
		return len(r.Problems) == 0
	}
}

// childConfig is what the paused buyer's process is given.
type childConfig struct {
	Redis, Postgres, Run string
	Fenced               bool
}

// pausedBuyer is buyer 0 in its own process: it buys one unit of sku-0
// and stops itself between its last check of the lock and its write.
func pausedBuyer(raw []byte) error {
	var cfg childConfig
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := openShop(ctx, cfg.Redis, cfg.Postgres, cfg.Run, cfg.Fenced)
	if err != nil {
		return err
	}
	defer s.close()
	out, err := s.buy(ctx, 0, skuName(0), func(lk *dlock.Lock, qty int) {
		harness.Say("paused token=%d stock=%d", lk.Token(), qty)
		harness.StopSelf()
	})
	switch {
	case out == rejected:
		harness.Say("result rejected %v", err)
	case err != nil:
		return err
	case out == bought:
		harness.Say("result wrote")
	default:
		harness.Say("result sold-out")
	}
	return nil
}

// runScenario runs one scenario in a run of its own: buyers 1..49 as
// goroutines and buyer 0 either among them or, with sc.pause, as a child
// process that takes sku-0's lock first, reads the stock and stops; it is
// continued once every other buyer is done (sku-0 sold out by buyers
// holding newer tokens), so its write comes after theirs.
func runScenario(ctx context.Context, e env, sc scenario, logf func(string, ...any)) (result, error) {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	run := e.run + "-" + map[bool]string{true: "fenced", false: "lock"}[sc.fenced] + map[bool]string{true: "-paused", false: ""}[sc.pause]
	s, err := openShop(ctx, e.redis, e.pg, run, sc.fenced)
	if err != nil {
		return result{}, err
	}
	defer s.close()
	if err := s.stockUp(ctx); err != nil {
		return result{}, err
	}
	var r result
	first := 0
	var child *harness.Child
	if sc.pause {
		first = 1
		child, err = harness.StartChild("buyer", childConfig{Redis: e.redis, Postgres: e.pg, Run: run, Fenced: sc.fenced})
		if err != nil {
			return r, err
		}
		defer child.Close()
		said, err := child.Expect(ctx, "paused")
		if err != nil {
			return r, err
		}
		if err := child.WaitStopped(ctx); err != nil {
			return r, err
		}
		logf("buyer 0 (pid %d) holds sku-0's lock and read its stock (%s); it stops itself (SIGSTOP) before its write, past its %v lease", child.Pid(), said, lockTTL)
	}

	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		counts  = map[outcome]int{}
		buyErrs []error
	)
	for b := first; b < buyers; b++ {
		wg.Go(func() {
			out, err := s.buy(ctx, b, skuName(b%skus), nil)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && out != rejected {
				buyErrs = append(buyErrs, fmt.Errorf("buyer %d: %w", b, err))
				return
			}
			counts[out]++
		})
	}
	wg.Wait()
	if err := errors.Join(buyErrs...); err != nil {
		return r, err
	}
	r.turnedAway = counts[soldOut]
	logf("%d buyers: %d bought, %d turned away (sold out), %d rejected", buyers-first, counts[bought], counts[soldOut], counts[rejected])
	if counts[rejected] > 0 {
		return r, fmt.Errorf("%d buyers that were never paused were rejected", counts[rejected])
	}

	if child != nil {
		if err := child.Continue(); err != nil {
			return r, err
		}
		said, err := child.Expect(ctx, "result")
		if err != nil {
			return r, err
		}
		if err := child.Wait(ctx); err != nil {
			return r, fmt.Errorf("buyer 0: %w", err)
		}
		r.pausedSaid = said
		switch {
		case strings.HasPrefix(said, "rejected"):
			r.pausedRejected = true
			logf("buyer 0 continued (SIGCONT): its write was REJECTED by pglock.Guard: %s", strings.TrimPrefix(said, "rejected "))
		case said == "wrote":
			r.pausedWrote = true
			logf("buyer 0 continued (SIGCONT): its write was ACCEPTED (nothing checks its token)")
		default:
			logf("buyer 0 continued (SIGCONT): %s", said)
		}
	}
	t, err := s.count(ctx)
	if err != nil {
		return r, err
	}
	r.tally = t
	logf("sold %d, left %d, stocked %d", t.Sold, t.Left, t.Start)
	return r, nil
}
