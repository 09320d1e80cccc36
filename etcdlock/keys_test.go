package etcdlock_test

import (
	"context"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/etcdlock/etcdtest"
)

// Keys with '/' and '%' get a queue directory of their own
// (escaped), List decodes it, and keys without them keep etcd's layout.
func TestKeyEncoding(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cli := newClient(t, c.Endpoints())
	l := etcdlock.New(cli)
	base := dlocktest.Key(t)
	for _, k := range []string{base, base + "/a", base + "/a/b%c", base + "%2Fa"} {
		lk, err := l.Acquire(dlocktest.Context(t), k)
		if err != nil {
			t.Fatal(err)
		}
		defer lk.Release(context.Background())
	}
	if got, want := l.QueuePrefix(base+"/a/b%c"), base+"%2Fa%2Fb%25c/"; got != want {
		t.Fatalf("QueuePrefix = %q, want %q", got, want)
	}
	if got := l.QueuePrefix(base); got != base+"/" {
		t.Fatalf("QueuePrefix of a plain key = %q, want etcd's layout %q", got, base+"/")
	}
	infos, err := l.List(dlocktest.Context(t), base)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, in := range infos {
		names = append(names, in.Key)
		if in.Waiters != 0 {
			t.Errorf("%q has %d waiters", in.Key, in.Waiters)
		}
	}
	// Sorted by key ('%' sorts before '/').
	if got, want := strings.Join(names, " "), strings.Join([]string{base, base + "%2Fa", base + "/a", base + "/a/b%c"}, " "); got != want {
		t.Fatalf("List = %v, want %v", got, want)
	}
	if infos, err := l.List(dlocktest.Context(t), base+"/a/"); err != nil || len(infos) != 1 || infos[0].Key != base+"/a/b%c" {
		t.Fatalf("List(%q) = %+v, %v", base+"/a/", infos, err)
	}
	resp, err := cli.Get(dlocktest.Context(t), base, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if k := strings.TrimPrefix(string(kv.Key), base); strings.Count(k, "/") != 1 {
			t.Errorf("entry %q is not directly in a queue directory", kv.Key)
		}
	}
}
