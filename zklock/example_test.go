package zklock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/zklock"
)

// These examples need a ZooKeeper ensemble, so they are compiled but not
// run.

func ExampleConnect() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Connect waits for a session and reads the session timeout the
	// ensemble granted: a lock's lease is two thirds of it.
	conn, err := zklock.Connect(ctx, []string{"zk1:2181", "zk2:2181", "zk3:2181"}, 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	l := zklock.New(conn, zklock.WithPrefix("/myapp/locks"))

	lk, err := l.Acquire(ctx, "nightly-report", dlock.WithWait(time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	defer lk.Release(context.Background())
	fmt.Println("holding with fencing token", lk.Token(), "lease", lk.TTL())
	select {
	case <-lk.Lost():
		log.Print("lock lost: ", lk.Err()) // stop working on the report
	case <-time.After(time.Second): // the work
	}
}

// A program that already has a go-zookeeper connection says which session
// timeout it asked for: zklock cannot read the granted one from it.
func ExampleWithSessionTimeout() {
	conn, _, err := zk.Connect([]string{"localhost:2181"}, 15*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	l := zklock.New(conn, zklock.WithSessionTimeout(15*time.Second))

	lk, err := l.TryAcquire(context.Background(), "import/customers")
	var na *dlock.NotAcquiredError
	switch {
	case errors.As(err, &na):
		fmt.Println("already running:", na.Holders[0])
		return
	case err != nil:
		log.Fatal(err)
	}
	defer lk.Release(context.Background())
}

// Digest authentication: Connect authenticates, and the Locker creates its
// znodes readable and writable by that identity only.
func ExampleWithDigest() {
	ctx := context.Background()
	auth := zklock.WithDigest("billing", "s3cret")
	conn, err := zklock.Connect(ctx, []string{"localhost:2181"}, 10*time.Second, auth)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	l := zklock.New(conn, zklock.WithPrefix("/billing"), auth)
	infos, err := l.List(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	for _, in := range infos {
		fmt.Println(in.Key, in.Holders[0], in.Waiters, "waiting")
	}
}
