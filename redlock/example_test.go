package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redlock"
)

// masters returns one client per independent Redis master. The examples
// need running servers, so they have no Output lines: they compile, and
// show the calls.
func masters() []redis.UniversalClient {
	var cls []redis.UniversalClient
	for _, addr := range []string{"redis-a:6379", "redis-b:6379", "redis-c:6379"} {
		cls = append(cls, redis.NewClient(&redis.Options{Addr: addr}))
	}
	return cls
}

// A Locker over three masters, with a key prefix of its own and the
// core's observer in the same option list.
func ExampleNew() {
	l := redlock.New(masters(),
		redlock.WithPrefix("billing"),
		dlock.WithObserver(dlock.NewSlogObserver(nil)),
	)
	fmt.Println("a lock needs", l.Quorum(), "of 3 nodes")
}

// Acquire waits for the key; the lock is renewed in the background until
// it is released.
func ExampleLocker_Acquire() {
	l := redlock.New(masters())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	lk, err := l.Acquire(ctx, "invoice:2026-11", dlock.WithTTL(10*time.Second))
	if err != nil {
		var qe *redlock.QuorumError
		if errors.As(err, &qe) {
			log.Printf("no majority: %v", qe) // node by node
		}
		log.Fatal(err)
	}
	defer lk.Release(context.Background())
	// Send the fencing token with every write to the protected resource.
	fmt.Println("holding", lk.Key(), "with token", lk.Token())
}

// Do holds the key while the function runs; its context is cancelled if
// the lock is lost.
func ExampleLocker_do() {
	l := redlock.New(masters())
	err := dlock.Do(context.Background(), l, "nightly-report", func(ctx context.Context, lk *dlock.Lock) error {
		fmt.Println("running with token", lk.Token())
		return nil
	}, dlock.WithTTL(30*time.Second))
	if errors.Is(err, dlock.ErrNotAcquired) {
		log.Print("someone else is running it")
	}
}

// List shows the keys a majority of nodes holds.
func ExampleLocker_List() {
	l := redlock.New(masters())
	infos, err := l.List(context.Background(), "invoice:")
	if err != nil {
		log.Fatal(err)
	}
	for _, in := range infos {
		fmt.Println(in.Key, "held by", in.Holders[0])
	}
}
