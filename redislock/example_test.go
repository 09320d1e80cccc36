package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock"
)

// These examples need a Redis server, so they are compiled but not run.

func ExampleNew() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer client.Close()
	// WithPrefix must be the same for every Locker that should exclude the
	// others; dlock.WithObserver reports acquisitions, renewals and losses.
	l := redislock.New(client, redislock.WithPrefix("myapp"))

	ctx := context.Background()
	lk, err := l.Acquire(ctx, "nightly-report", dlock.WithTTL(30*time.Second), dlock.WithWait(time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	defer lk.Release(ctx)
	fmt.Println("holding with fencing token", lk.Token())
	select {
	case <-lk.Lost():
		log.Print("lock lost: ", lk.Err()) // stop working on the report
	case <-time.After(time.Second): // the work
	}
}

func ExampleLocker_Acquire() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer client.Close()
	l := redislock.New(client)

	ctx := context.Background()
	lk, err := l.TryAcquire(ctx, "import/customers")
	var na *dlock.NotAcquiredError
	switch {
	case errors.As(err, &na):
		fmt.Println("already running:", na.Holders[0])
		return
	case err != nil:
		log.Fatal(err)
	}
	defer lk.Release(ctx)
	// ... import, watching lk.Lost() ...
}

func Example_do() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer client.Close()
	l := redislock.New(client)

	err := dlock.Do(context.Background(), l, "rebuild-index", func(ctx context.Context, lk *dlock.Lock) error {
		// ctx ends when the lock is lost.
		fmt.Println("rebuilding with token", lk.Token())
		return nil
	}, dlock.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
}

// A holder writes through a Guard with its lock's fence: once a newer
// holder has written (or read), the older holder's writes are refused.
func ExampleNewGuard() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer client.Close()
	l := redislock.New(client)
	g := redislock.NewGuard(client)

	ctx := context.Background()
	lk, err := l.Acquire(ctx, "account:7")
	if err != nil {
		log.Fatal(err)
	}
	defer lk.Release(ctx)
	err = g.Put(ctx, "account:7", lk.Fence(), "balance", "70")
	if errors.Is(err, dlock.ErrStaleToken) {
		log.Print("a newer holder took over; not writing")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	balance, ok, err := g.Get(ctx, "account:7", lk.Fence(), "balance")
	fmt.Println(balance, ok, err)
}

// Eval runs a script under the fence check; its data keys come from Key so
// that they share the fence key's Cluster slot.
func ExampleGuard_Eval() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer client.Close()
	g := redislock.NewGuard(client)

	ctx := context.Background()
	f := dlock.Fence{Token: 42, Owner: "3f2a9c"} // lk.Fence() of a held lock
	n, err := g.Eval(ctx, "queue:emails", f,
		`redis.call('RPUSH', KEYS[1], ARGV[1]); return redis.call('LLEN', KEYS[1])`,
		[]string{g.Key("queue:emails", "pending")}, "hello@example.com")
	fmt.Println(n, err)
}

// A read-write lock: any number of readers (each with a lease, token and
// Lost() of its own) or one writer; a writer that waits keeps new readers
// out until it has had its turn.
func Example_readWrite() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer client.Close()
	l := redislock.New(client)

	ctx := context.Background()
	r, err := l.Acquire(ctx, "catalog", dlock.WithShared(), dlock.WithWait(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	// ... read the catalog, watching r.Lost() ...
	r.Release(ctx)

	w, err := l.Acquire(ctx, "catalog", dlock.WithWait(time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	defer w.Release(ctx)
	fmt.Println("rewriting the catalog with fencing token", w.Token())
}

// A semaphore: at most 4 holders of "render" at a time; every caller must
// name the same limit (another one is an error wrapping
// dlock.ErrLimitMismatch).
func Example_semaphore() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer client.Close()
	l := redislock.New(client)

	ctx := context.Background()
	p, err := l.Acquire(ctx, "render", dlock.WithLimit(4), dlock.WithWait(time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	defer p.Release(ctx)
	// ... render, watching p.Lost() ...
}
