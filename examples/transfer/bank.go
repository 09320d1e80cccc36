package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/pglock"
)

const (
	accounts = 10
	opening  = 1000 // every account's opening balance
	// lockTTL is every worker's lease on an account's lock: etcd's
	// shortest (leases are whole seconds, at least 1.5 × the election
	// timeout).
	lockTTL = 2 * time.Second
	// think is a worker's time between reading the balances and writing
	// them (a fraud check).
	think = time.Millisecond
)

// schema is the bank's tables; run separates the runs of the program. The
// ledger has a row for every transfer a worker carried out (or declined),
// with no unique key on the transfer, so that a double application shows.
const schema = `
CREATE TABLE IF NOT EXISTS transfer_accounts (run text, id int, balance bigint NOT NULL, PRIMARY KEY (run, id));
CREATE TABLE IF NOT EXISTS transfer_ledger (seq bigserial PRIMARY KEY, run text NOT NULL, transfer int NOT NULL,
	src int NOT NULL, dst int NOT NULL, amount bigint NOT NULL, declined bool NOT NULL)`

// transfer moves Amount from account From to account To.
type transfer struct {
	ID, From, To int
	Amount       int64
}

func (t transfer) String() string {
	return fmt.Sprintf("#%d (%d from acct-%d to acct-%d)", t.ID, t.Amount, t.From, t.To)
}

// bank is one worker's view of the bank: an etcd lock per account, the
// balances in PostgreSQL and, when fenced, a pglock.Guard that checks the
// locks' tokens in the transactions that read and write them.
type bank struct {
	etcd   *clientv3.Client
	pool   *pgxpool.Pool
	locker dlock.Locker
	guard  *pglock.Guard // nil: the locks alone
	run    string
	// afterRead, if not nil (tests), runs after each read of the balances.
	afterRead func(h held)
}

// openBank connects with default clients (etcd clientv3, pgxpool) and
// creates the tables and the guard's tables if they are missing.
func openBank(ctx context.Context, etcdEndpoint, pgURL, run string, fenced bool) (*bank, error) {
	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdEndpoint}})
	if err != nil {
		pool.Close()
		return nil, err
	}
	b := &bank{etcd: cli, pool: pool, locker: etcdlock.New(cli), run: run}
	if _, err := pool.Exec(ctx, schema); err != nil {
		b.close()
		return nil, fmt.Errorf("creating the tables: %w", err)
	}
	if fenced {
		if err := pglock.MigrateGuard(ctx, pool); err != nil {
			b.close()
			return nil, err
		}
		b.guard = pglock.NewGuard(pool)
	}
	return b, nil
}

func (b *bank) close() {
	b.etcd.Close()
	b.pool.Close()
}

// key is the lock key of an account in this run, and the guard's resource.
func (b *bank) key(id int) string { return fmt.Sprintf("transfer/%s/acct-%d", b.run, id) }

// open puts every account at its opening balance for this run.
func (b *bank) open(ctx context.Context) error {
	for id := range accounts {
		if _, err := b.pool.Exec(ctx, `INSERT INTO transfer_accounts (run, id, balance) VALUES ($1, $2, $3)`, b.run, id, opening); err != nil {
			return err
		}
	}
	return nil
}

type outcome int

const (
	applied  outcome = iota
	declined         // insufficient funds
	rejected         // the guard refused a lock's token
)

// held is a transfer's two account locks, in account order.
type held struct {
	ids   []int
	locks []*dlock.Lock
}

// apply carries out t: lock both accounts (in account order, so two
// workers never wait for each other), read both balances, check the
// funds, check the locks are still held, then write both new balances and
// the ledger row in one transaction. beforeWrite, if not nil, runs between
// that check and the write: where a process pause does its harm.
//
// Fenced, the read and the write each run in a transaction that first
// checks both locks' fences with the guard (in account order): the read
// records the tokens, so older holders can no longer write, and the write
// commits only if no newer holder of either account has checked in since.
// A refused check returns rejected and the *dlock.StaleTokenError.
//
// A lock lost before the write (its renewals starved on a loaded host)
// has protected nothing yet, and the transfer starts over, as an
// application would, up to applyTries times.
func (b *bank) apply(ctx context.Context, t transfer, beforeWrite func(h held, from, to int64)) (outcome, error) {
	for try := 1; ; try++ {
		out, err := b.applyOnce(ctx, t, beforeWrite)
		if !errors.Is(err, errLostBeforeWrite) || try == applyTries {
			return out, err
		}
	}
}

// applyTries bounds a transfer's starts.
const applyTries = 3

// errLostBeforeWrite: one of the transfer's locks was lost before its
// write.
var errLostBeforeWrite = errors.New("lock lost before the write")

func (b *bank) applyOnce(ctx context.Context, t transfer, beforeWrite func(h held, from, to int64)) (outcome, error) {
	h := held{ids: []int{t.From, t.To}}
	slices.Sort(h.ids)
	for _, id := range h.ids {
		lk, err := b.locker.Acquire(ctx, b.key(id), dlock.WithTTL(lockTTL))
		if err != nil {
			return 0, err
		}
		// A lock lost meanwhile (the paused worker's) reports ErrLockLost
		// here; what it protected is what the guard and the invariant check.
		defer lk.Release(context.WithoutCancel(ctx))
		h.locks = append(h.locks, lk)
	}
	var from, to int64
	err := b.tx(ctx, h, func(tx pgx.Tx) error {
		const q = `SELECT balance FROM transfer_accounts WHERE run = $1 AND id = $2`
		if err := tx.QueryRow(ctx, q, b.run, t.From).Scan(&from); err != nil {
			return err
		}
		return tx.QueryRow(ctx, q, b.run, t.To).Scan(&to)
	})
	if errors.Is(err, dlock.ErrStaleToken) {
		return rejected, err
	}
	if err != nil {
		return 0, err
	}
	if b.afterRead != nil {
		b.afterRead(h)
	}
	time.Sleep(think)
	for i, lk := range h.locks {
		if err := lk.Err(); err != nil {
			return 0, fmt.Errorf("transfer %v: %w on acct-%d: %w", t, errLostBeforeWrite, h.ids[i], err)
		}
	}
	if beforeWrite != nil {
		beforeWrite(h, from, to)
	}
	out := applied
	if from < t.Amount {
		out = declined
	}
	err = b.tx(ctx, h, func(tx pgx.Tx) error {
		if out == applied {
			const u = `UPDATE transfer_accounts SET balance = $3 WHERE run = $1 AND id = $2`
			if _, err := tx.Exec(ctx, u, b.run, t.From, from-t.Amount); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, u, b.run, t.To, to+t.Amount); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO transfer_ledger (run, transfer, src, dst, amount, declined) VALUES ($1, $2, $3, $4, $5, $6)`,
			b.run, t.ID, t.From, t.To, t.Amount, out == declined)
		return err
	})
	if errors.Is(err, dlock.ErrStaleToken) {
		return rejected, err
	}
	if err != nil {
		return 0, err
	}
	return out, nil
}

// tx runs fn in a transaction; fenced, after checking h's fences first.
func (b *bank) tx(ctx context.Context, h held, fn func(tx pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if b.guard != nil {
			for i, id := range h.ids {
				if err := b.guard.Check(ctx, tx, b.key(id), h.locks[i].Fence()); err != nil {
					return err
				}
			}
		}
		return fn(tx)
	})
}

// books is the state of the bank after a run, and what is wrong with it.
type books struct {
	Sum, Want         int64
	Applied, Declined int
	Problems          []string
}

// audit reads the balances and the ledger of this run and checks the
// invariant: the sum of the balances is what the accounts opened with,
// every transfer in the ledger once, no balance negative, and every
// balance what the ledger says (opening + in − out).
func (b *bank) audit(ctx context.Context, queued int) (books, error) {
	bk := books{Want: accounts * opening}
	balance := map[int]int64{}
	rows, err := b.pool.Query(ctx, `SELECT id, balance FROM transfer_accounts WHERE run = $1 ORDER BY id`, b.run)
	if err != nil {
		return bk, err
	}
	for rows.Next() {
		var id int
		var bal int64
		if err := rows.Scan(&id, &bal); err != nil {
			return bk, err
		}
		balance[id] = bal
		bk.Sum += bal
	}
	if err := rows.Err(); err != nil {
		return bk, err
	}
	ledger := map[int]int64{}
	for id := range balance {
		ledger[id] = opening
	}
	times := map[int]int{}
	rows, err = b.pool.Query(ctx, `SELECT transfer, src, dst, amount, declined FROM transfer_ledger WHERE run = $1 ORDER BY seq`, b.run)
	if err != nil {
		return bk, err
	}
	for rows.Next() {
		var id, src, dst int
		var amount int64
		var decl bool
		if err := rows.Scan(&id, &src, &dst, &amount, &decl); err != nil {
			return bk, err
		}
		times[id]++
		if decl {
			bk.Declined++
			continue
		}
		bk.Applied++
		ledger[src] -= amount
		ledger[dst] += amount
	}
	if err := rows.Err(); err != nil {
		return bk, err
	}
	if bk.Sum != bk.Want {
		bk.Problems = append(bk.Problems, fmt.Sprintf("sum %d ≠ %d", bk.Sum, bk.Want))
	}
	for id := range queued {
		if n := times[id]; n != 1 {
			bk.Problems = append(bk.Problems, fmt.Sprintf("transfer #%d carried out %d times", id, n))
		}
	}
	for id := range accounts {
		if balance[id] < 0 {
			bk.Problems = append(bk.Problems, fmt.Sprintf("acct-%d: balance %d", id, balance[id]))
		}
		if balance[id] != ledger[id] {
			bk.Problems = append(bk.Problems, fmt.Sprintf("acct-%d: balance %d, ledger says %d", id, balance[id], ledger[id]))
		}
	}
	return bk, nil
}
