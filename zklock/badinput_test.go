package zklock_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/zklock"
)

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// Connect refuses bad arguments at once, and an ensemble it cannot reach
// (nothing listening, or a server that accepts and never answers) by its
// context's deadline.
func TestConnectBadInput(t *testing.T) {
	t.Parallel()
	ctx := dlocktest.Context(t)
	for name, tc := range map[string]struct {
		servers []string
		session time.Duration
		opts    []zklock.Option
	}{
		"no servers":       {nil, time.Second, nil},
		"not host:port":    {[]string{"localhost"}, time.Second, nil},
		"empty host":       {[]string{":2181"}, time.Second, nil},
		"zero session":     {[]string{"127.0.0.1:2181"}, 0, nil},
		"negative session": {[]string{"127.0.0.1:2181"}, -time.Second, nil},
		"huge session":     {[]string{"127.0.0.1:2181"}, 1 << 62, nil},
		"empty user":       {[]string{"127.0.0.1:2181"}, time.Second, []zklock.Option{zklock.WithDigest("", "pw")}},
		"user with colon":  {[]string{"127.0.0.1:2181"}, time.Second, []zklock.Option{zklock.WithDigest("a:b", "pw")}},
	} {
		c, err := zklock.Connect(ctx, tc.servers, tc.session, tc.opts...)
		if !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("%s: Connect = %v, %v; want ErrInvalidOption", name, c, err)
		}
	}
	//lint:ignore SA1012 a nil context is the bad input under test
	if _, err := zklock.Connect(nil, []string{"127.0.0.1:2181"}, time.Second); !errors.Is(err, dlock.ErrInvalidOption) { //nolint:staticcheck
		t.Errorf("nil ctx: %v", err)
	}

	hung, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Close()
	for name, addr := range map[string]string{"closed port": closedPort(t), "hung server": hung.Addr().String()} {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		deadline, _ := ctx.Deadline()
		m := dlocktest.StartStallMeter(deadline)
		_, err := zklock.Connect(ctx, []string{addr}, time.Second, zklock.WithLogger(quiet{}))
		end := time.Now()
		stalled := m.StopAt(end)
		cancel()
		t.Logf("%s: Connect returned %v after its deadline (the process stalled %v of it)", name, end.Sub(deadline), stalled)
		if over := dlocktest.Overrun(deadline, end, stalled); over > dlocktest.OverrunBound {
			t.Errorf("%s: Connect overran its deadline by %v while the process ran", name, over)
		}
		if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: Connect = %v; want ErrUnavailable and the deadline", name, err)
		}
	}
}

// New refuses what it cannot work with, with an error from every call.
func TestNewBadInput(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	good := connect(t, []string{z.Addr()})
	plain, _, err := zk.Connect([]string{z.Addr()}, sessionTimeout, zk.WithLogger(quiet{}))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	for name, tc := range map[string]struct {
		l    *zklock.Locker
		want error
	}{
		"nil conn":             {zklock.New(nil), dlock.ErrNilClient},
		"relative prefix":      {zklock.New(good, zklock.WithPrefix("dlock")), dlock.ErrInvalidOption},
		"trailing slash":       {zklock.New(good, zklock.WithPrefix("/dlock/")), dlock.ErrInvalidOption},
		"empty segment":        {zklock.New(good, zklock.WithPrefix("/a//b")), dlock.ErrInvalidOption},
		"dot segment":          {zklock.New(good, zklock.WithPrefix("/a/./b")), dlock.ErrInvalidOption},
		"control char":         {zklock.New(good, zklock.WithPrefix("/a\x01")), dlock.ErrInvalidOption},
		"negative timeout":     {zklock.New(good, zklock.WithRequestTimeout(-time.Second)), dlock.ErrInvalidOption},
		"unknown session":      {zklock.New(plain), dlock.ErrInvalidOption},
		"session too short":    {zklock.New(plain, zklock.WithSessionTimeout(time.Millisecond)), dlock.ErrInvalidOption},
		"session out of range": {zklock.New(plain, zklock.WithSessionTimeout(1<<62)), dlock.ErrInvalidOption},
	} {
		_, err := tc.l.TryAcquire(dlocktest.Context(t), "k")
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: TryAcquire = %v, want %v", name, err, tc.want)
		}
		if _, err := tc.l.List(dlocktest.Context(t), ""); !errors.Is(err, tc.want) {
			t.Errorf("%s: List = %v, want %v", name, err, tc.want)
		}
	}
	if _, err := zklock.New(good, zklock.WithPrefix("/")).TryAcquire(dlocktest.Context(t), "zookeeper"); err != nil {
		t.Errorf(`prefix "/" with the key "zookeeper" (reserved at the root): %v`, err)
	}
}

// A wrong digest password is not refused by ZooKeeper at connect time; it
// shows on the first lock under znodes made by the right identity, as a
// clear error in bounded time, never as a held lock or a hang.
func TestWrongDigest(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	addrs := []string{z.Addr()}
	secure := uniquePrefix(t) + "/secure"
	right := zklock.New(connect(t, addrs, zklock.WithDigest("app", "s3cret")), zklock.WithPrefix(secure), zklock.WithDigest("app", "s3cret"))
	lk, err := right.Acquire(dlocktest.Context(t), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	wrong := zklock.New(connect(t, addrs, zklock.WithDigest("app", "guess")), zklock.WithPrefix(secure), zklock.WithDigest("app", "guess"))
	for _, key := range []string{"k", "other"} {
		_, err := wrong.TryAcquire(dlocktest.Context(t), key)
		if !errors.Is(err, zk.ErrNoAuth) || errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("TryAcquire(%q) with a wrong password: %v; want zk.ErrNoAuth, not ErrNotAcquired", key, err)
		}
		if !strings.Contains(err.Error(), "credentials") || strings.Contains(err.Error(), "guess") {
			t.Fatalf("error %q should point at the credentials without showing them", err)
		}
	}
	nobody := zklock.New(connect(t, addrs), zklock.WithPrefix(secure))
	if _, err := nobody.TryAcquire(dlocktest.Context(t), "k"); !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("TryAcquire without credentials: %v; want zk.ErrNoAuth", err)
	}
}

// Bad mode input never panics, hangs or leaves a node: limits outside
// [1, MaxLimit], WithShared with WithLimit, a nil context, on both
// TryAcquire and Acquire.
// Symptom: a panic, a hang or a node left behind on bad WithLimit or WithShared input.
func TestAcquireBadModeInput_RefusedNoNodeLeft(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	admin := connect(t, []string{z.Addr()})
	l := zklock.New(admin)
	key := dlocktest.Key(t)
	bad := [][]dlock.Option{
		{dlock.WithLimit(0)},
		{dlock.WithLimit(-1)},
		{dlock.WithLimit(dlock.MaxLimit + 1)},
		{dlock.WithLimit(1 << 62)},
		{dlock.WithShared(), dlock.WithLimit(2)},
		{dlock.WithLimit(2), dlock.WithShared()},
	}
	for _, opts := range bad {
		if _, err := l.TryAcquire(dlocktest.Context(t), key, opts...); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Fatalf("TryAcquire %d options: %v, want ErrInvalidOption", len(opts), err)
		}
		if _, err := l.Acquire(dlocktest.Context(t), key, opts...); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Fatalf("Acquire %d options: %v, want ErrInvalidOption", len(opts), err)
		}
	}
	//lint:ignore SA1012 a nil context is the bad input under test
	if _, err := l.TryAcquire(nil, key, dlock.WithLimit(2)); err == nil { //nolint:staticcheck
		t.Fatal("TryAcquire with a nil context succeeded")
	}
	//lint:ignore SA1012 a nil context is the bad input under test
	if _, err := l.Acquire(nil, key, dlock.WithShared()); err == nil { //nolint:staticcheck
		t.Fatal("Acquire with a nil context succeeded")
	}
	if kids, _, err := admin.Children(l.Path(key)); err == nil && len(kids) > 0 {
		t.Fatalf("bad input left nodes: %v", kids)
	}
}

// Path on the zero Locker and FencePath on the zero Guard return the
// default prefix's path instead of dereferencing a nil backend: bad input
// gives a clear error, never a panic (the zero Guard fails every call
// with ErrNilClient).
// Symptom: Path on the zero Locker and FencePath on the zero Guard panicked.
func TestZeroValues_PathAndFencePathDoNotPanic(t *testing.T) {
	for name, fn := range map[string]func() string{
		"Locker{}.Path":     func() string { var l zklock.Locker; return l.Path("k") },
		"Guard{}.FencePath": func() string { var g zklock.Guard; return g.FencePath("r") },
	} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s panicked: %v", name, r)
				}
			}()
			t.Logf("%s = %q", name, fn())
		}()
	}
}
