// Command transfer is a case study of dlock: money moves between accounts
// in PostgreSQL. A worker carries out a transfer under an etcd lock on
// each of its two accounts (etcdlock): it reads both balances and writes
// the new ones. One worker is a separate process that stops itself
// (SIGSTOP) before its write, after its last check of the locks, until its
// leases ran out and its transfer, handed to the other workers, was
// carried out by them. When it continues:
//
//   - fenced (pglock.Guard checks both locks' tokens inside the transfer's
//     transaction), its write is rejected: the sum of the balances stays
//     the same and the transfer was carried out once;
//   - with the locks alone, its write goes through: the transfer is
//     carried out twice, and its stale balances undo a later transfer.
//
// Usage:
//
//	go run ./transfer [-etcd http://host:port] [-pg postgres://...]
//
// With no flags it runs an etcd server inside the program (embedded) and
// starts PostgreSQL (`make deps` installs it). It exits 1 if an invariant
// that must hold does not, or if the unfenced run shows no violation.
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

	"github.com/dlock-go/dlock/etcdlock/etcdtest"
	"github.com/dlock-go/dlock/examples/internal/harness"
)

const (
	workers   = 6
	transfers = 100
)

// children are the roles this binary runs in when re-executed.
var children = map[string]func([]byte) error{"worker": pausedWorker}

func main() {
	harness.RunChild(children)
	etcdURL := flag.String("etcd", "", "etcd client `URL` (default: run an etcd server in this process)")
	pgURL := flag.String("pg", "", "PostgreSQL `URL` (default: start a PostgreSQL server)")
	flag.Parse()
	harness.Main("transfer", func(ctx context.Context, p *harness.Program) error {
		e := env{Postgres: harness.Postgres(p, *pgURL), Etcd: *etcdURL, Run: newRunID()}
		if e.Etcd == "" {
			e.Etcd = etcdtest.Start(p, 1).Endpoints()[0]
		}
		fmt.Printf("transfer: %d accounts × %d, %d transfers by %d workers, an etcd lock per account (etcdlock, %v lease), balances in PostgreSQL\n",
			accounts, opening, transfers, workers, lockTTL)
		ok := true
		for _, fenced := range []bool{true, false} {
			fmt.Printf("[%s]\n", scenarioName(fenced))
			r, err := runScenario(ctx, e, fenced, func(format string, args ...any) { fmt.Printf("  "+format+"\n", args...) })
			if err != nil {
				return fmt.Errorf("%s: %w", scenarioName(fenced), err)
			}
			fmt.Println("  " + r.invariantLine(fenced))
			ok = ok && r.asExpected(fenced)
		}
		if !ok {
			return errors.New("FAIL: an outcome was not the expected one")
		}
		fmt.Println("transfer: ok: fenced, the paused worker's transfer was rejected; with the locks alone it was carried out twice")
		return nil
	})
}

func newRunID() string { return fmt.Sprintf("%06x", rand.Uint32()&0xffffff) }

func scenarioName(fenced bool) string {
	if fenced {
		return "fenced by pglock.Guard in the transfer's transaction, worker W paused"
	}
	return "locks only, worker W paused"
}

// env is where the servers are, and the run's name; also the paused
// worker's configuration.
type env struct {
	Etcd, Postgres, Run string
	Fenced              bool
}

// queue is the run's transfers: #0 (the one the paused worker takes) and
// #1 both draw on acct-0, whose balance covers them whatever the order;
// the others move money between acct-2..acct-9 and may be declined.
func queue() []transfer {
	rng := rand.New(rand.NewPCG(13, 13))
	q := []transfer{{ID: 0, From: 0, To: 1, Amount: 100}, {ID: 1, From: 0, To: 5, Amount: 50}}
	for id := 2; id < transfers; id++ {
		from := 2 + rng.IntN(accounts-2)
		to := 2 + (from-2+1+rng.IntN(accounts-3))%(accounts-2)
		q = append(q, transfer{ID: id, From: from, To: to, Amount: 1 + rng.Int64N(100)})
	}
	return q
}

// result is the outcome of a scenario.
type result struct {
	books
	pausedRejected, pausedApplied bool
	pausedSaid                    string
}

func (r result) invariantLine(fenced bool) string {
	inv := fmt.Sprintf("invariant (sum of balances = %d, every transfer carried out once, balances = the ledger):", r.Want)
	switch {
	case len(r.Problems) == 0 && r.pausedRejected:
		return inv + " holds; 1 stale transfer rejected"
	case len(r.Problems) == 0:
		return inv + " holds"
	case !fenced:
		return inv + " VIOLATED: " + strings.Join(r.Problems, "; ") + " (expected: the negative control)"
	default:
		return inv + " VIOLATED: " + strings.Join(r.Problems, "; ")
	}
}

func (r result) asExpected(fenced bool) bool {
	if fenced {
		return len(r.Problems) == 0 && r.pausedRejected
	}
	return len(r.Problems) > 0 && r.pausedApplied
}

// pausedWorker is worker W in its own process: it carries out transfer #0
// and stops itself between its last check of the locks and its write.
func pausedWorker(raw []byte) error {
	var e env
	if err := json.Unmarshal(raw, &e); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := openBank(ctx, e.Etcd, e.Postgres, e.Run, e.Fenced)
	if err != nil {
		return err
	}
	defer b.close()
	out, err := b.apply(ctx, queue()[0], func(h held, from, to int64) {
		harness.Say("paused tokens %d and %d, balances %d and %d", h.locks[0].Token(), h.locks[1].Token(), from, to)
		harness.StopSelf()
	})
	switch {
	case out == rejected:
		harness.Say("result rejected %v", err)
	case err != nil:
		return err
	case out == applied:
		harness.Say("result applied")
	default:
		harness.Say("result declined")
	}
	return nil
}

// runScenario runs one scenario in a run of its own. Worker W, a child
// process, takes transfer #0's locks, reads the balances and stops. Its
// transfer is handed to the other workers with the rest of the queue
// (they wait for W's leases to run out); W is continued once they are
// done, so its write comes after theirs.
func runScenario(ctx context.Context, e env, fenced bool, logf func(string, ...any)) (result, error) {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	e.Fenced = fenced
	e.Run += map[bool]string{true: "-fenced", false: "-locks"}[fenced]
	var r result
	b, err := openBank(ctx, e.Etcd, e.Postgres, e.Run, fenced)
	if err != nil {
		return r, err
	}
	defer b.close()
	if err := b.open(ctx); err != nil {
		return r, err
	}
	q := queue()
	child, err := harness.StartChild("worker", e)
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
	logf("worker W (pid %d) holds acct-0 and acct-1 for transfer %v and read them (%s); it stops itself (SIGSTOP) before its write, past its %v leases",
		child.Pid(), q[0], said, lockTTL)

	work := make(chan transfer)
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		counts = map[outcome]int{}
		errs   []error
	)
	for range workers {
		wg.Go(func() {
			for t := range work {
				out, err := b.apply(ctx, t, nil)
				mu.Lock()
				if err != nil {
					errs = append(errs, fmt.Errorf("transfer %v: %w", t, err))
				} else {
					counts[out]++
				}
				mu.Unlock()
			}
		})
	}
	for _, t := range q {
		work <- t
	}
	close(work)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return r, err
	}
	logf("transfer #0 handed to the other workers: %d workers carried out %d transfers, declined %d (insufficient funds)",
		workers, counts[applied], counts[declined])

	if err := child.Continue(); err != nil {
		return r, err
	}
	said, err = child.Expect(ctx, "result")
	if err != nil {
		return r, err
	}
	if err := child.Wait(ctx); err != nil {
		return r, fmt.Errorf("worker W: %w", err)
	}
	r.pausedSaid = said
	switch {
	case strings.HasPrefix(said, "rejected"):
		r.pausedRejected = true
		logf("worker W continued (SIGCONT): transfer #0 REJECTED by pglock.Guard: %s", strings.TrimPrefix(said, "rejected "))
	case said == "applied":
		r.pausedApplied = true
		logf("worker W continued (SIGCONT): transfer #0 carried out AGAIN, from the balances it read before its pause")
	default:
		logf("worker W continued (SIGCONT): %s", said)
	}
	if r.books, err = b.audit(ctx, len(q)); err != nil {
		return r, err
	}
	logf("sum of balances %d; ledger: %d transfers carried out, %d declined", r.Sum, r.Applied, r.Declined)
	return r, nil
}
