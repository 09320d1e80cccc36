package etcdlock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/dlock-go/dlock"
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

func TestInteropWithConcurrencyMutex(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cli := newClient(t, c.Endpoints())
	l := etcdlock.New(newClient(t, c.Endpoints()))
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)

	// etcd's Mutex holds → dlock cannot.
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m := concurrency.NewMutex(s, key)
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = l.TryAcquire(ctx, key)
	if !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("dlock TryAcquire while a Mutex holds: %v", err)
	}
	// dlock waits for the Mutex's release.
	got := make(chan *dlock.Lock, 1)
	go func() {
		lk, err := l.Acquire(ctx, key)
		if err != nil {
			t.Error(err)
		}
		got <- lk
	}()
	time.Sleep(100 * time.Millisecond)
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lk := <-got
	if lk == nil {
		t.FailNow()
	}
	// dlock holds → the Mutex cannot, and its Lock waits for dlock.
	m2 := concurrency.NewMutex(s, key)
	if err := m2.TryLock(ctx); !errors.Is(err, concurrency.ErrLocked) {
		t.Fatalf("Mutex.TryLock while dlock holds: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- m2.Lock(ctx) }()
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Mutex.Lock returned while dlock holds: %v", err)
	default:
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	m2.Unlock(ctx)
	// The key layout is etcd's: "<key>/<lease hex>".
	lk, err = l.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(ctx)
	infos, err := l.List(ctx, key)
	if err != nil || len(infos) != 1 || len(infos[0].Holders) != 1 || infos[0].Holders[0].Token != lk.Token() || infos[0].Holders[0].Owner != lk.Owner() {
		t.Fatalf("List = %+v, %v", infos, err)
	}
	resp, err := cli.Get(ctx, key+"/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 || string(resp.Kvs[0].Key) != key+"/"+strconv.FormatInt(resp.Kvs[0].Lease, 16) {
		t.Fatalf("layout: %v %v", resp.Kvs, err)
	}
	if resp.Kvs[0].CreateRevision != int64(lk.Token()) {
		t.Fatalf("token %d is not the create revision %d", lk.Token(), resp.Kvs[0].CreateRevision)
	}
}

// Which etcdctl/concurrency.Mutex locks contend with a dlock key, both
// ways round. etcd's recipe knows no escaping: a Mutex whose raw name is
// a dlock key's escaped form shares its queue directory, and a Mutex whose
// name extends a dlock key's directory with "/..." has its entries inside
// it (the queue of "d" is the prefix "d/", which holds "d/e"'s entries);
// a Mutex of the same name as a dlock key with '/' or '%' does not
// contend with it. docs/etcdlock.md (Keys with '/' or '%') states this.
// Symptom: the documentation implied that keys with '/' or '%' meet no foreign lock at all (corrected in c4d039a).
func TestForeignLocksOnEscapedNames(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cli := newClient(t, c.Endpoints())
	l := etcdlock.New(newClient(t, c.Endpoints()))
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	base := dlocktest.Key(t)
	for _, tc := range []struct {
		dlockKey, mutexName string
		mutexBlocksDlock    bool
		dlockBlocksMutex    bool
	}{
		// Same name, neither '/' nor '%': etcd's layout, mutual exclusion.
		{base + "p", base + "p", true, true},
		// The raw name equals the escaped form: the same directory.
		{base + "a%", base + "a%25", true, true},
		{base + "b/c", base + "b%2Fc", true, true},
		// The raw name extends the escaped form with "/...": its entries
		// are in dlock's directory, not the other way round.
		{base + "d", base + "d/e", true, false},
		{base + "a%", base + "a%25/x", true, false},
		// Same name with '/' or '%': different directories.
		{base + "b/c", base + "b/c", false, false},
		{base + "a%", base + "a%", false, false},
		// dlock's own hierarchy is escaped: "d/e" is not inside "d/".
		{base + "d/e", base + "d", false, false},
	} {
		name := "dlock " + tc.dlockKey + " vs Mutex " + tc.mutexName
		m := concurrency.NewMutex(s, tc.mutexName)
		if err := m.TryLock(dlocktest.Context(t)); err != nil {
			t.Fatalf("%s: Mutex.TryLock: %v", name, err)
		}
		lk, err := l.TryAcquire(dlocktest.Context(t), tc.dlockKey)
		switch {
		case err == nil:
			if tc.mutexBlocksDlock {
				t.Errorf("%s: the Mutex does not block dlock", name)
			}
			lk.Release(context.Background())
		case errors.Is(err, dlock.ErrNotAcquired):
			if !tc.mutexBlocksDlock {
				t.Errorf("%s: the Mutex blocks dlock: %v", name, err)
			}
		default:
			t.Fatalf("%s: TryAcquire: %v", name, err)
		}
		if err := m.Unlock(dlocktest.Context(t)); err != nil {
			t.Fatal(err)
		}

		lk, err = l.TryAcquire(dlocktest.Context(t), tc.dlockKey)
		if err != nil {
			t.Fatalf("%s: TryAcquire with no Mutex held: %v", name, err)
		}
		m = concurrency.NewMutex(s, tc.mutexName)
		switch err := m.TryLock(dlocktest.Context(t)); {
		case err == nil:
			if tc.dlockBlocksMutex {
				t.Errorf("%s: dlock does not block the Mutex", name)
			}
			m.Unlock(dlocktest.Context(t))
		case errors.Is(err, concurrency.ErrLocked):
			if !tc.dlockBlocksMutex {
				t.Errorf("%s: dlock blocks the Mutex", name)
			}
		default:
			t.Fatalf("%s: Mutex.TryLock: %v", name, err)
		}
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// Hierarchical names are separate locks in every mode: a writer of "a/b"
// while readers hold "a", a writer of "a" while permits hold "a/b".
// Symptom: a lock on "a/b" contending with a lock on "a" in some mode.
func TestKeys_HierarchicalNamesAreSeparateInEveryMode(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	l := etcdlock.New(newClient(t, c.Endpoints()))
	l2 := etcdlock.New(newClient(t, c.Endpoints()))
	ctx := dlocktest.Context(t)
	a := dlocktest.Key(t)
	ab := a + "/b"
	r, err := l.TryAcquire(ctx, a, dlock.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	w, err := l2.TryAcquire(ctx, ab)
	if err != nil {
		t.Fatalf("writer of %q while readers hold %q: %v", ab, a, err)
	}
	rel(t, w)
	rel(t, r)
	p, err := l.TryAcquire(ctx, ab, dlock.WithLimit(2))
	if err != nil {
		t.Fatal(err)
	}
	w, err = l2.TryAcquire(ctx, a)
	if err != nil {
		t.Fatalf("writer of %q while a permit holds %q: %v", a, ab, err)
	}
	if _, err := l2.TryAcquire(ctx, ab, dlock.WithLimit(3)); !errors.Is(err, dlock.ErrLimitMismatch) {
		t.Fatalf("limit 3 on %q (semaphore of 2): %v", ab, err)
	}
	if _, err := l2.TryAcquire(ctx, a, dlock.WithShared()); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("reader of %q while a writer holds it: %v", a, err)
	}
	infos, err := l.List(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 || infos[0].Key != a || infos[0].Mode != dlock.Exclusive || infos[1].Key != ab || infos[1].Mode != dlock.Limited || infos[1].Limit != 2 || len(infos[1].Holders) != 1 {
		t.Fatalf("List: %+v", infos)
	}
	rel(t, w)
	rel(t, p)
}

// QueuePrefix on the zero Locker reports DefaultPrefix's layout, as does
// a Locker that New refused.
// Symptom: QueuePrefix on the zero Locker panicked.
func TestQueuePrefix_ZeroLockerUsesDefaultPrefix(t *testing.T) {
	t.Parallel()
	var zero etcdlock.Locker
	if got := zero.QueuePrefix("a/b"); got != "a%2Fb/" {
		t.Fatalf("zero Locker QueuePrefix %q", got)
	}
	if got := etcdlock.New(nil).QueuePrefix("k"); got != "k/" {
		t.Fatalf("refused Locker QueuePrefix %q", got)
	}
}
