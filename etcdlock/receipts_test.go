package etcdlock_test

import (
	"errors"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/etcdlock/etcdtest"
)

// receiptDir mirrors the package's directory of release receipts (with
// the default empty prefix).
const receiptDir = "\x00dlock-released/"

// Receipts are not locks: dlock cannot name a queue directory that holds
// them, List skips them, a concurrency.Mutex on the key of a released
// lock is not blocked, and they do not pile up: the next release deletes
// the receipts whose outcome is known.
// Symptom: receipts listed as locks, blocking a Mutex, or left behind one per release.
func TestReleaseReceiptsAreNotLocksAndDoNotPileUp(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cli := newClient(t, c.Endpoints())
	l := etcdlock.New(newClient(t, c.Endpoints()))
	if _, err := l.TryAcquire(dlocktest.Context(t), strings.TrimSuffix(receiptDir, "/")); !errors.Is(err, dlock.ErrInvalidKey) {
		t.Fatalf("TryAcquire on the receipts' directory name = %v, want ErrInvalidKey", err)
	}
	base := dlocktest.Key(t)
	const n = 20
	for i := 0; i < n; i++ {
		lk, err := l.Acquire(dlocktest.Context(t), base)
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := cli.Get(dlocktest.Context(t), receiptDir, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	// Sequential releases: each deletes the previous one's receipt.
	if len(resp.Kvs) != 1 {
		t.Fatalf("%d receipts left after %d sequential releases, want 1 (the last): %q", len(resp.Kvs), n, resp.Kvs)
	}
	if resp.Kvs[0].Lease == 0 {
		t.Fatalf("receipt %q has no lease: it would outlive its lock's lease", resp.Kvs[0].Key)
	}
	infos, err := l.List(dlocktest.Context(t), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range infos {
		if strings.Contains(in.Key, "dlock-released") {
			t.Fatalf("List shows a receipt as a lock: %+v", in)
		}
	}
	if len(infos) != 0 {
		t.Fatalf("List after every release = %+v, want none", infos)
	}
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m := concurrency.NewMutex(s, base)
	if err := m.TryLock(dlocktest.Context(t)); err != nil {
		t.Fatalf("Mutex on a released key: %v", err)
	}
	m.Unlock(dlocktest.Context(t))
}
