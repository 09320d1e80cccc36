package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/pglock"
	"github.com/dlock-go/dlock/redislock"
)

const (
	skus   = 4 // SKUs on sale
	perSKU = 5 // units of each in stock: 20 items
	// lockTTL is every buyer's lease on its SKU's lock.
	lockTTL = time.Second
	// think is the time a buyer spends between reading the stock and
	// writing it (authorising the payment).
	think = 2 * time.Millisecond
)

// schema is the shop's two tables; run separates the runs of the program.
const schema = `
CREATE TABLE IF NOT EXISTS inventory_stock (run text, sku text, qty int NOT NULL, PRIMARY KEY (run, sku));
CREATE TABLE IF NOT EXISTS inventory_orders (id bigserial PRIMARY KEY, run text NOT NULL, sku text NOT NULL, buyer int NOT NULL, token numeric(20) NOT NULL)`

// shop is one buyer's view of the shop: a Redis lock per SKU, the stock
// in PostgreSQL and, when fenced, a pglock.Guard that checks the lock's
// token in the transactions that read and write the stock.
type shop struct {
	rdb    *redis.Client
	pool   *pgxpool.Pool
	locker dlock.Locker
	guard  *pglock.Guard // nil: the lock alone
	run    string
	// afterRead, if not nil (tests), runs after each stock read.
	afterRead func(lk *dlock.Lock)
}

// openShop connects with default clients (go-redis, pgxpool) and creates
// the tables and the guard's tables if they are missing.
func openShop(ctx context.Context, redisAddr, pgURL, run string, fenced bool) (*shop, error) {
	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return nil, err
	}
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	s := &shop{rdb: rdb, pool: pool, locker: redislock.New(rdb), run: run}
	if _, err := pool.Exec(ctx, schema); err != nil {
		s.close()
		return nil, fmt.Errorf("creating the tables: %w", err)
	}
	if fenced {
		if err := pglock.MigrateGuard(ctx, pool); err != nil {
			s.close()
			return nil, err
		}
		s.guard = pglock.NewGuard(pool)
	}
	return s, nil
}

func (s *shop) close() {
	s.rdb.Close()
	s.pool.Close()
}

// key is the lock key of a SKU in this run, and the guard's resource.
func (s *shop) key(sku string) string { return "inventory/" + s.run + "/" + sku }

func skuName(i int) string { return fmt.Sprintf("sku-%d", i) }

// stockUp puts perSKU units of every SKU in stock for this run.
func (s *shop) stockUp(ctx context.Context) error {
	for i := range skus {
		if _, err := s.pool.Exec(ctx, `INSERT INTO inventory_stock (run, sku, qty) VALUES ($1, $2, $3)`, s.run, skuName(i), perSKU); err != nil {
			return err
		}
	}
	return nil
}

type outcome int

const (
	bought   outcome = iota
	soldOut          // the stock read was 0
	rejected         // the guard refused the lock's token
)

// buy is one buyer's purchase of one unit of sku: lock the SKU, read its
// stock, authorise the payment, check the lock is still held, take one
// unit and record the order. beforeWrite, if not nil, runs between that
// last check and the write: where a process pause does its harm.
//
// Fenced, the read and the write each run in a transaction that first
// checks the lock's fence with the guard: the read records the token, so
// an older holder can no longer write, and the write commits only if no
// newer holder has checked in since. A refused check returns rejected and
// the *dlock.StaleTokenError.
//
// A lock lost before the write (its renewals starved on a loaded host)
// has protected nothing yet, and the buyer starts over, as an application
// would, up to buyTries times.
func (s *shop) buy(ctx context.Context, buyer int, sku string, beforeWrite func(lk *dlock.Lock, qty int)) (outcome, error) {
	for try := 1; ; try++ {
		out, err := s.buyOnce(ctx, buyer, sku, beforeWrite)
		if !errors.Is(err, errLostBeforeWrite) || try == buyTries {
			return out, err
		}
	}
}

// buyTries bounds a buyer's starts.
const buyTries = 3

// errLostBeforeWrite: the buyer's lock was lost before its write.
var errLostBeforeWrite = errors.New("lock lost before the write")

func (s *shop) buyOnce(ctx context.Context, buyer int, sku string, beforeWrite func(lk *dlock.Lock, qty int)) (outcome, error) {
	lk, err := s.locker.Acquire(ctx, s.key(sku), dlock.WithTTL(lockTTL))
	if err != nil {
		return 0, err
	}
	// A lock lost meanwhile (the paused buyer's) reports ErrLockLost here;
	// what it protected is what the guard and the invariant check.
	defer lk.Release(context.WithoutCancel(ctx))

	qty, err := s.readStock(ctx, lk, sku)
	if errors.Is(err, dlock.ErrStaleToken) {
		return rejected, err
	}
	if err != nil {
		return 0, err
	}
	if qty <= 0 {
		return soldOut, nil
	}
	if s.afterRead != nil {
		s.afterRead(lk)
	}
	time.Sleep(think)
	if err := lk.Err(); err != nil {
		return 0, fmt.Errorf("buyer %d: %w on %s: %w", buyer, errLostBeforeWrite, sku, err)
	}
	if beforeWrite != nil {
		beforeWrite(lk, qty)
	}
	err = s.takeOne(ctx, lk, buyer, sku)
	if errors.Is(err, dlock.ErrStaleToken) {
		return rejected, err
	}
	if err != nil {
		return 0, err
	}
	return bought, nil
}

// readStock reads sku's stock: fenced, in a transaction that checks the
// lock's fence first.
func (s *shop) readStock(ctx context.Context, lk *dlock.Lock, sku string) (int, error) {
	const q = `SELECT qty FROM inventory_stock WHERE run = $1 AND sku = $2`
	var qty int
	if s.guard == nil {
		err := s.pool.QueryRow(ctx, q, s.run, sku).Scan(&qty)
		return qty, err
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := s.guard.Check(ctx, tx, s.key(sku), lk.Fence()); err != nil {
			return err
		}
		return tx.QueryRow(ctx, q, s.run, sku).Scan(&qty)
	})
	return qty, err
}

// takeOne takes one unit of sku out of stock and records the order, in
// one transaction; fenced, the guard's check comes first in it.
func (s *shop) takeOne(ctx context.Context, lk *dlock.Lock, buyer int, sku string) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if s.guard != nil {
			if err := s.guard.Check(ctx, tx, s.key(sku), lk.Fence()); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE inventory_stock SET qty = qty - 1 WHERE run = $1 AND sku = $2`, s.run, sku); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO inventory_orders (run, sku, buyer, token) VALUES ($1, $2, $3, $4)`, s.run, sku, buyer, lk.Token())
		return err
	})
}

// tally is the state of the shop after a run, and what is wrong with it.
type tally struct {
	Start, Sold, Left int
	Problems          []string // violations of the invariant, per SKU
}

// count reads the stock and the orders of this run and checks the
// invariant for every SKU: stock never negative, no more sold than there
// was, sold + left = start.
func (s *shop) count(ctx context.Context) (tally, error) {
	left := map[string]int{}
	sold := map[string]int{}
	rows, err := s.pool.Query(ctx, `SELECT sku, qty FROM inventory_stock WHERE run = $1`, s.run)
	if err != nil {
		return tally{}, err
	}
	for rows.Next() {
		var sku string
		var qty int
		if err := rows.Scan(&sku, &qty); err != nil {
			return tally{}, err
		}
		left[sku] = qty
	}
	if err := rows.Err(); err != nil {
		return tally{}, err
	}
	rows, err = s.pool.Query(ctx, `SELECT sku, count(*) FROM inventory_orders WHERE run = $1 GROUP BY sku`, s.run)
	if err != nil {
		return tally{}, err
	}
	for rows.Next() {
		var sku string
		var n int
		if err := rows.Scan(&sku, &n); err != nil {
			return tally{}, err
		}
		sold[sku] = n
	}
	if err := rows.Err(); err != nil {
		return tally{}, err
	}
	t := tally{Start: skus * perSKU}
	var names []string
	for sku := range left {
		names = append(names, sku)
	}
	sort.Strings(names)
	for _, sku := range names {
		l, n := left[sku], sold[sku]
		t.Left += l
		t.Sold += n
		if l < 0 {
			t.Problems = append(t.Problems, fmt.Sprintf("%s: stock %d", sku, l))
		}
		if n > perSKU {
			t.Problems = append(t.Problems, fmt.Sprintf("%s: %d sold of %d", sku, n, perSKU))
		}
		if n+l != perSKU {
			t.Problems = append(t.Problems, fmt.Sprintf("%s: sold %d + left %d ≠ %d", sku, n, l, perSKU))
		}
	}
	if len(names) != skus {
		t.Problems = append(t.Problems, fmt.Sprintf("%d SKUs in stock, want %d", len(names), skus))
	}
	return t, nil
}
