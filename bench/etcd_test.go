package bench

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/etcdlock/etcdtest"
)

func etcdClient(b *testing.B) *clientv3.Client {
	c := etcdtest.Start(b, 1)
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cli.Close() })
	return cli
}

// BenchmarkEtcdMutex is etcd's own recipe: one session, Lock+Unlock.
func BenchmarkEtcdMutex(b *testing.B) {
	cli := etcdClient(b)
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(30))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		m := concurrency.NewMutex(s, benchKey())
		if err := m.Lock(ctx); err != nil {
			b.Fatal(err)
		}
		if err := m.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEtcdlock is dlock's etcdlock on the same kind of server.
func BenchmarkEtcdlock(b *testing.B) {
	benchLocker(b, etcdlock.New(etcdClient(b)))
}
