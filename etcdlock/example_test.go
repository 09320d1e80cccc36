package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
)

// The examples talk to an etcd server at localhost:2379, so they are
// compiled but not run.

func newEtcdClient() *clientv3.Client {
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	return client
}

// A Locker on an etcd client. It takes the core's options too: here an
// Observer that logs every acquisition, renewal, loss and release.
func ExampleNew() {
	client := newEtcdClient()
	defer client.Close()
	locker := etcdlock.New(client,
		etcdlock.WithPrefix("locks/"),                             // lock KEY lives under "locks/KEY/"
		etcdlock.WithRequestTimeout(2*time.Second),                // each request to etcd
		dlock.WithObserver(dlock.NewSlogObserver(slog.Default())), // the core's option
	)
	lk, err := locker.TryAcquire(context.Background(), "nightly-report")
	switch {
	case errors.Is(err, dlock.ErrNotAcquired):
		var na *dlock.NotAcquiredError
		if errors.As(err, &na) && len(na.Holders) > 0 {
			fmt.Println("busy:", na.Holders[0])
		}
		return
	case err != nil:
		log.Fatal(err)
	}
	defer lk.Release(context.Background())
	fmt.Println("token", lk.Token(), "lease", lk.TTL()) // the TTL etcd applied
}

// Acquire waits in the key's FIFO queue until the lock is free or the
// context ends; the watchdog keeps the lease alive until Release.
func ExampleLocker_Acquire() {
	client := newEtcdClient()
	defer client.Close()
	locker := etcdlock.New(client)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lk, err := locker.Acquire(ctx, "inventory:42", dlock.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer lk.Release(context.Background())
	select {
	case <-lk.Lost():
		log.Print("lock lost: ", lk.Err())
	case <-time.After(time.Second): // the work
	}
}

// Do holds the lock while fn runs; fn's context ends if the lock is lost.
func ExampleLocker_do() {
	client := newEtcdClient()
	defer client.Close()
	locker := etcdlock.New(client)
	err := dlock.Do(context.Background(), locker, "migrations", func(ctx context.Context, lk *dlock.Lock) error {
		fmt.Println("migrating with token", lk.Token())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// A Guard fences data kept in etcd: the holder's writes carry its fence,
// and once a newer holder has used the resource an older one is refused.
func ExampleNewGuard() {
	client := newEtcdClient()
	defer client.Close()
	locker := etcdlock.New(client)
	g := etcdlock.NewGuard(client) // keys under etcdlock.DefaultGuardPrefix
	ctx := context.Background()
	err := dlock.Do(ctx, locker, "account:7", func(ctx context.Context, lk *dlock.Lock) error {
		v, _, err := g.Get(ctx, "account:7", lk.Fence(), "balance")
		if err != nil {
			return err
		}
		return g.Put(ctx, "account:7", lk.Fence(), "balance", v+"+1")
	})
	if errors.Is(err, dlock.ErrStaleToken) {
		log.Print("a newer holder used the account: nothing written")
	} else if err != nil {
		log.Fatal(err)
	}
}

// Txn runs any etcd operations under the fence check, in one transaction.
func ExampleGuard_Txn() {
	client := newEtcdClient()
	defer client.Close()
	g := etcdlock.NewGuard(client, etcdlock.WithGuardPrefix("app/fences/"))
	f := dlock.Fence{Token: 42, Owner: "worker-b"} // in a real program, Lock.Fence()
	resp, err := g.Txn(context.Background(), "orders", f,
		clientv3.OpPut("app/orders/17", "shipped"),
		clientv3.OpDelete("app/queue/17"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("revision", resp.Header.Revision)
}
