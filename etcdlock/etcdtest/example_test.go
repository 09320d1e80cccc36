package etcdtest_test

import (
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/etcdlock/etcdtest"
)

// A test starts a real single-member etcd in-process, on a free loopback
// port, stopped at the test's cleanup.
func ExampleStart() {
	_ = func(t *testing.T) {
		c := etcdtest.Start(t, 1)
		client, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints()})
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		_ = etcdlock.New(client)
	}
}
