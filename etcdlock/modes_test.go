package etcdlock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/etcdlock/etcdtest"
)

// Readers share the key; a writer queued behind them waits for every one
// of them (released out of order) and keeps later readers out while it
// waits: a shared TryAcquire is refused, leaving nothing in the queue, and
// a blocking reader queues behind it. Tokens grow with every grant.
func TestSharedWriterPreference(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cli := newClient(t, c.Endpoints())
	l := etcdlock.New(newClient(t, c.Endpoints()))
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)

	r1, err := l.Acquire(ctx, key, dlock.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	r2, err := l.Acquire(ctx, key, dlock.WithShared())
	if err != nil {
		t.Fatalf("second reader: %v", err)
	}
	if r2.Token() <= r1.Token() || !r1.Fence().Shared {
		t.Fatalf("readers: tokens %d, %d, fence %+v", r1.Token(), r2.Token(), r1.Fence())
	}
	wch := acquireBG(t, nil, l, key)
	awaitQueueLen(t, cli, l, key, 3)

	_, err = l.TryAcquire(ctx, key, dlock.WithShared())
	var na *dlock.NotAcquiredError
	if !errors.As(err, &na) {
		t.Fatalf("shared TryAcquire behind a waiting writer: %v, want ErrNotAcquired", err)
	}
	if len(na.Holders) != 2 || na.Holders[0].Token != r1.Token() || na.Holders[1].Token != r2.Token() || na.Holders[0].Mode != dlock.Shared {
		t.Errorf("refusal names %+v, want the two readers", na.Holders)
	}
	if n := queueLen(t, cli, l, key); n != 3 {
		t.Fatalf("a refused shared TryAcquire left the queue at %d entries, want 3", n)
	}
	rch := acquireBG(t, nil, l, key, dlock.WithShared())
	awaitQueueLen(t, cli, l, key, 4)

	rel(t, r1) // the first reader leaves: the writer still waits for r2
	time.Sleep(300 * time.Millisecond)
	pending(t, wch, "writer behind a reader")
	pending(t, rch, "reader behind a writer")
	rel(t, r2)
	w := got(t, wch, "writer after both readers left")
	if w.Token() <= r2.Token() {
		t.Fatalf("writer token %d not above the readers' %d", w.Token(), r2.Token())
	}
	time.Sleep(300 * time.Millisecond)
	pending(t, rch, "reader behind the holding writer")
	rel(t, w)
	r3 := got(t, rch, "reader after the writer")
	if r3.Token() <= w.Token() {
		t.Fatalf("reader token %d not above the writer's %d", r3.Token(), w.Token())
	}
}

// Waiters of both modes are served in arrival order: a reader behind a
// writer behind readers, and so on; consecutive readers are granted
// together.
func TestSharedFIFO(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cli := newClient(t, c.Endpoints())
	l := etcdlock.New(newClient(t, c.Endpoints()))
	key := dlocktest.Key(t)
	r0, err := l.Acquire(dlocktest.Context(t), key, dlock.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	w1 := acquireBG(t, nil, l, key)
	awaitQueueLen(t, cli, l, key, 2)
	r1 := acquireBG(t, nil, l, key, dlock.WithShared())
	awaitQueueLen(t, cli, l, key, 3)
	r2 := acquireBG(t, nil, l, key, dlock.WithShared())
	awaitQueueLen(t, cli, l, key, 4)
	w2 := acquireBG(t, nil, l, key)
	awaitQueueLen(t, cli, l, key, 5)
	r3 := acquireBG(t, nil, l, key, dlock.WithShared())
	awaitQueueLen(t, cli, l, key, 6)

	rel(t, r0)
	lw1 := got(t, w1, "first writer")
	pending(t, r1, "reader behind the first writer")
	rel(t, lw1)
	lr1, lr2 := got(t, r1, "first queued reader"), got(t, r2, "second queued reader")
	if lr1.Token() <= lw1.Token() || lr2.Token() <= lr1.Token() {
		t.Fatalf("tokens w1 %d r1 %d r2 %d: want increasing", lw1.Token(), lr1.Token(), lr2.Token())
	}
	rel(t, lr2)
	time.Sleep(300 * time.Millisecond)
	pending(t, w2, "second writer behind a reader")
	pending(t, r3, "reader behind the second writer")
	rel(t, lr1)
	lw2 := got(t, w2, "second writer")
	pending(t, r3, "reader behind the second writer")
	rel(t, lw2)
	lr3 := got(t, r3, "last reader")
	if lr3.Token() <= lw2.Token() {
		t.Fatalf("last reader token %d not above the writer's %d", lr3.Token(), lw2.Token())
	}
}

// A writer that gives up (its context ends) stops keeping readers out: its
// entry is removed and a shared TryAcquire succeeds.
func TestSharedWriterGivesUp(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cli := newClient(t, c.Endpoints())
	l := etcdlock.New(newClient(t, c.Endpoints()))
	key := dlocktest.Key(t)
	r, err := l.Acquire(dlocktest.Context(t), key, dlock.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	defer rel(t, r)
	ctx, cancel := context.WithCancel(dlocktest.Context(t))
	wch := acquireBG(t, ctx, l, key)
	awaitQueueLen(t, cli, l, key, 2)
	if _, err := l.TryAcquire(dlocktest.Context(t), key, dlock.WithShared()); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("shared TryAcquire behind a waiting writer: %v", err)
	}
	cancel()
	select {
	case a := <-wch:
		// ErrUnavailable is the contract too when the cancel caught an
		// attempt in flight (its outcome unknown, so it is undone): a
		// loaded machine's etcd can be slower than the attempt's grace.
		cutShort := errors.Is(a.err, dlock.ErrUnavailable) && errors.Is(a.err, context.Canceled)
		if !errors.Is(a.err, dlock.ErrNotAcquired) && !cutShort {
			t.Fatalf("cancelled writer: %v, want ErrNotAcquired (or ErrUnavailable for an attempt the cancel cut short)", a.err)
		}
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("cancelled writer: hang")
	}
	awaitQueueLen(t, cli, l, key, 1)
	r2, err := l.TryAcquire(dlocktest.Context(t), key, dlock.WithShared())
	if err != nil {
		t.Fatalf("shared TryAcquire once the writer gave up: %v", err)
	}
	rel(t, r2)
}

// A reader whose client goes silent (a crash, as far as etcd can tell)
// loses its own lease alone: the writer waiting behind it and another
// reader is granted the key once that lease expired (when etcd's lessor
// gets to it: bounded here by the hang bound only), after the crashed
// reader's Lost() closed; the other reader's lock is untouched.
func TestCrashedReaderDoesNotBlockWriter(t *testing.T) {
	t.Parallel()
	c, crashL, p := proxied(t)
	cli := newClient(t, c.Endpoints())
	l := etcdlock.New(newClient(t, c.Endpoints()))
	key := dlocktest.Key(t)
	crashed, err := crashL.Acquire(dlocktest.Context(t), key, dlock.WithShared(), dlock.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// The healthy reader's and the writer's leases leave their renewals
	// room on a loaded machine; only the crashed reader's expires.
	ttl := dlock.WithTTL(5 * time.Second)
	healthy, err := l.Acquire(dlocktest.Context(t), key, dlock.WithShared(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	wch := acquireBG(t, nil, l, key, ttl)
	awaitQueueLen(t, cli, l, key, 3)
	p.Stall() // the crashed reader's keep-alives stop reaching etcd
	stalled := time.Now()
	select {
	case <-crashed.Lost():
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("the silent reader's Lost() never closed")
	}
	// Its lease expires on the server after its last renewal (when etcd's
	// lessor gets to it: no bound is asserted but the hang bound); the
	// healthy reader still holds.
	deadline := time.Now().Add(dlocktest.HangTimeout)
	for queueLen(t, cli, l, key) != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("hang: the silent reader's entry outlived its lease: %v after the stall", time.Since(stalled))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := healthy.Err(); err != nil {
		t.Fatalf("the other reader lost its lock with the silent one: %v", err)
	}
	pending(t, wch, "writer behind the healthy reader")
	rel(t, healthy)
	w := got(t, wch, "writer after the readers")
	if w.Token() <= healthy.Token() || w.Token() <= crashed.Token() {
		t.Fatalf("writer token %d not above the readers' %d, %d", w.Token(), crashed.Token(), healthy.Token())
	}
	p.Heal()
}

// A semaphore of 2: two permits hold at once, the third waits and is let
// in by the release of either holder (here the older one, which is not
// the entry just ahead of it); a different limit is ErrLimitMismatch naming
// both limits, for TryAcquire and Acquire; another mode is refused naming
// the holders.
func TestSemaphore(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cli := newClient(t, c.Endpoints())
	l := etcdlock.New(newClient(t, c.Endpoints()))
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	p1, err := l.Acquire(ctx, key, dlock.WithLimit(2))
	if err != nil {
		t.Fatal(err)
	}
	p2, err := l.Acquire(ctx, key, dlock.WithLimit(2))
	if err != nil {
		t.Fatalf("second permit: %v", err)
	}
	if p2.Token() <= p1.Token() || !p1.Fence().Shared {
		t.Fatalf("permits: tokens %d, %d, fence %+v", p1.Token(), p2.Token(), p1.Fence())
	}
	for _, try := range []bool{true, false} {
		var err error
		if try {
			_, err = l.TryAcquire(ctx, key, dlock.WithLimit(3))
		} else {
			_, err = l.Acquire(ctx, key, dlock.WithLimit(3))
		}
		if !errors.Is(err, dlock.ErrLimitMismatch) || !strings.Contains(err.Error(), "2") || !strings.Contains(err.Error(), "3") {
			t.Fatalf("limit 3 on a semaphore of 2 (try %v): %v, want ErrLimitMismatch naming both", try, err)
		}
	}
	awaitQueueLen(t, cli, l, key, 2) // the mismatched Acquire's entry is removed
	for _, opt := range []dlock.Option{dlock.WithShared(), dlock.WithTTL(2 * time.Second)} {
		_, err := l.TryAcquire(ctx, key, opt)
		var na *dlock.NotAcquiredError
		if !errors.As(err, &na) || len(na.Holders) != 2 || na.Holders[0].Mode != dlock.Limited {
			t.Fatalf("another mode on a semaphore: %v (holders %+v), want ErrNotAcquired naming the 2 permits", err, na)
		}
	}
	if _, err := l.TryAcquire(ctx, key, dlock.WithLimit(2)); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("third of 2 permits: %v", err)
	}
	p3ch := acquireBG(t, nil, l, key, dlock.WithLimit(2))
	awaitQueueLen(t, cli, l, key, 3)
	p4ch := acquireBG(t, nil, l, key, dlock.WithLimit(2))
	awaitQueueLen(t, cli, l, key, 4)
	rel(t, p1) // not the entry just ahead of the waiter
	p3 := got(t, p3ch, "third permit after the first left")
	time.Sleep(300 * time.Millisecond)
	pending(t, p4ch, "fourth permit while two hold")
	rel(t, p3) // the entry just ahead of the fourth
	p4 := got(t, p4ch, "fourth permit")
	if p3.Token() <= p2.Token() || p4.Token() <= p3.Token() {
		t.Fatalf("tokens %d %d %d: want increasing", p2.Token(), p3.Token(), p4.Token())
	}
	rel(t, p2)
	rel(t, p4)
	w, err := l.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("exclusive once the semaphore is free: %v", err)
	}
	if w.Token() <= p4.Token() {
		t.Fatalf("writer token %d not above the permits' %d", w.Token(), p4.Token())
	}
	rel(t, w)
	// Once the last holder is gone the next grant sets the limit afresh.
	q, err := l.TryAcquire(ctx, key, dlock.WithLimit(5))
	if err != nil {
		t.Fatalf("a new limit on a free key: %v", err)
	}
	rel(t, q)
}

// Entries queued with another limit that do not hold yet are not a
// mismatch: the permit queued behind them waits; once they hold, it fails
// with ErrLimitMismatch (and its entry is removed).
func TestSemaphoreMismatchWhileQueued(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cli := newClient(t, c.Endpoints())
	l := etcdlock.New(newClient(t, c.Endpoints()))
	key := dlocktest.Key(t)
	x, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	three := acquireBG(t, nil, l, key, dlock.WithLimit(3))
	awaitQueueLen(t, cli, l, key, 2)
	five := acquireBG(t, nil, l, key, dlock.WithLimit(5))
	awaitQueueLen(t, cli, l, key, 3)
	time.Sleep(300 * time.Millisecond)
	pending(t, five, "permit of 5 behind a queued permit of 3")
	rel(t, x)
	p := got(t, three, "permit of 3")
	select {
	case a := <-five:
		if !errors.Is(a.err, dlock.ErrLimitMismatch) {
			t.Fatalf("permit of 5 once permits of 3 hold: %v, %v; want ErrLimitMismatch", a.lk, a.err)
		}
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("permit of 5: hang")
	}
	awaitQueueLen(t, cli, l, key, 1)
	rel(t, p)
}

// List shows each key's mode, limit, every holder with its mode and TTL,
// and the waiters.
func TestListModes(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cli := newClient(t, c.Endpoints())
	l := etcdlock.New(newClient(t, c.Endpoints()))
	ctx := dlocktest.Context(t)
	pfx := dlocktest.Key(t)
	rw, sem := pfx+"-rw", pfx+"-sem"
	r1, err := l.Acquire(ctx, rw, dlock.WithShared(), dlock.WithMetadata("n", "1"))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := l.Acquire(ctx, rw, dlock.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	w := acquireBG(t, wctx, l, rw)
	awaitQueueLen(t, cli, l, rw, 3)
	r := acquireBG(t, wctx, l, rw, dlock.WithShared())
	awaitQueueLen(t, cli, l, rw, 4)
	defer func() {
		cancel()
		for _, ch := range []<-chan acquired{w, r} {
			if a := <-ch; a.err == nil {
				rel(t, a.lk)
			}
		}
		// The cancelled waiters' entries are removed in the background:
		// let that finish before the client closes.
		awaitQueueLen(t, cli, l, rw, 0)
	}()
	s1, err := l.Acquire(ctx, sem, dlock.WithLimit(2))
	if err != nil {
		t.Fatal(err)
	}
	infos, err := l.List(ctx, pfx)
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 || infos[0].Key != rw || infos[1].Key != sem {
		t.Fatalf("List = %+v, want %s and %s", infos, rw, sem)
	}
	i := infos[0]
	if i.Mode != dlock.Shared || i.Waiters != 2 || len(i.Holders) != 2 {
		t.Fatalf("read-write key: %+v, want shared, 2 holders, 2 waiters", i)
	}
	for j, lk := range []*dlock.Lock{r1, r2} {
		h := i.Holders[j]
		if h.Owner != lk.Owner() || h.Token != lk.Token() || h.Mode != dlock.Shared || h.TTL <= 0 {
			t.Errorf("holder %d = %+v, want owner %s token %d, shared, a TTL", j, h, lk.Owner(), lk.Token())
		}
	}
	if i.Holders[0].Metadata["n"] != "1" {
		t.Errorf("holder metadata %v", i.Holders[0].Metadata)
	}
	s := infos[1]
	if s.Mode != dlock.Limited || s.Limit != 2 || len(s.Holders) != 1 || s.Holders[0].Token != s1.Token() || s.Waiters != 0 {
		t.Fatalf("semaphore: %+v, want limited, limit 2, one holder", s)
	}
	rel(t, s1)
	rel(t, r1)
	rel(t, r2)
}

// Writers, permits of a semaphore of 2 and impatient permits (whose waits
// end by their context, removing their entries from the middle of the
// permits' windows) contend on one key through several Lockers: a writer
// never overlaps anyone, at most 2 permits hold at once, every token is
// granted once and a writer's token is above every token granted before
// it, and every patient contender completes its rounds.
func TestMixedModesStress(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	lockers := make([]*etcdlock.Locker, 3)
	for i := range lockers {
		lockers[i] = etcdlock.New(newClient(t, c.Endpoints()))
	}
	key := dlocktest.Key(t)
	const limit, rounds = 2, 4
	var (
		mu               sync.Mutex
		writers, permits int
		maxToken         uint64
		seen             = map[uint64]bool{}
		problems         []string
		wg               sync.WaitGroup
	)
	enter := func(lk *dlock.Lock, writer bool) {
		mu.Lock()
		defer mu.Unlock()
		if seen[lk.Token()] {
			problems = append(problems, "token granted twice: "+strconv.FormatUint(lk.Token(), 10))
		}
		seen[lk.Token()] = true
		if writer {
			if writers > 0 || permits > 0 {
				problems = append(problems, "a writer entered with others inside")
			}
			if lk.Token() <= maxToken {
				problems = append(problems, "a writer's token is not above an earlier grant's")
			}
			writers++
		} else {
			if writers > 0 {
				problems = append(problems, "a permit entered with a writer inside")
			}
			permits++
			if permits > limit {
				problems = append(problems, "more permits than the limit")
			}
		}
		maxToken = max(maxToken, lk.Token())
	}
	leave := func(writer bool) {
		mu.Lock()
		if writer {
			writers--
		} else {
			permits--
		}
		mu.Unlock()
	}
	errs := make(chan error, 16)
	run := func(l *etcdlock.Locker, writer, impatient bool) {
		defer wg.Done()
		// The leases outlive renewals on a loaded machine: the test is
		// about modes excluding each other, not about expiry.
		opts := []dlock.Option{dlock.WithTTL(5 * time.Second)}
		if !writer {
			opts = append(opts, dlock.WithLimit(limit))
		}
		if impatient {
			opts = append(opts, dlock.WithWait(30*time.Millisecond))
		}
		for range rounds {
			lk, err := l.Acquire(dlocktest.Context(t), key, opts...)
			if impatient && (errors.Is(err, dlock.ErrNotAcquired) || errors.Is(err, dlock.ErrUnavailable)) {
				continue
			}
			if err != nil {
				errs <- err
				return
			}
			enter(lk, writer)
			time.Sleep(10 * time.Millisecond)
			leave(writer)
			if err := lk.Release(dlocktest.Context(t)); err != nil {
				errs <- err
				return
			}
		}
	}
	for i := range 8 {
		wg.Add(1)
		go run(lockers[i%len(lockers)], i < 2, i >= 6)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * dlocktest.HangTimeout):
		t.Fatal("hang: contenders did not finish")
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// etcd's concurrency.Mutex knows no modes: its entries are exclusive. It
// cannot lock while dlock readers hold, a Mutex waiting behind them keeps
// new readers out as a dlock writer does, and readers behind a Mutex that
// holds wait for it.
func TestSharedInteropWithConcurrencyMutex(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cli := newClient(t, c.Endpoints())
	l := etcdlock.New(newClient(t, c.Endpoints()))
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r, err := l.Acquire(ctx, key, dlock.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	m := concurrency.NewMutex(s, key)
	if err := m.TryLock(ctx); !errors.Is(err, concurrency.ErrLocked) {
		t.Fatalf("Mutex.TryLock while a dlock reader holds: %v", err)
	}
	locked := make(chan error, 1)
	go func() { locked <- m.Lock(ctx) }()
	awaitQueueLen(t, cli, l, key, 2)
	_, err = l.TryAcquire(ctx, key, dlock.WithShared())
	var na *dlock.NotAcquiredError
	if !errors.As(err, &na) || len(na.Holders) != 1 || na.Holders[0].Token != r.Token() {
		t.Fatalf("shared TryAcquire behind a waiting Mutex: %v, want ErrNotAcquired naming the reader", err)
	}
	rch := acquireBG(t, nil, l, key, dlock.WithShared())
	awaitQueueLen(t, cli, l, key, 3)
	rel(t, r)
	select {
	case err := <-locked:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: the Mutex was not granted after the reader left")
	}
	time.Sleep(300 * time.Millisecond)
	pending(t, rch, "reader behind a Mutex that holds")
	infos, err := l.List(ctx, key)
	if err != nil || len(infos) != 1 || infos[0].Mode != dlock.Exclusive || len(infos[0].Holders) != 1 || infos[0].Waiters != 1 ||
		!strings.HasPrefix(infos[0].Holders[0].Owner, "lease ") {
		t.Fatalf("List while the Mutex holds = %+v, %v", infos, err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	got(t, rch, "reader after the Mutex")
}

// Entries that are not dlock's, or whose mode cannot be read (a broken
// value, a limit below 1), count as exclusive: never more sharing than
// recorded, and no panic or hang.
func TestJunkEntriesAreExclusive(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cli := newClient(t, c.Endpoints())
	l := etcdlock.New(newClient(t, c.Endpoints()))
	ctx := dlocktest.Context(t)
	for _, v := range []string{``, `{`, `{"mode":"shared"`, `{"mode":"limited","limit":0}`, `{"mode":"limited","limit":-3}`, `{"mode":"other"}`, `[1]`, `{"mode":7}`} {
		key := dlocktest.Key(t)
		g, err := cli.Grant(ctx, 60)
		if err != nil {
			t.Fatal(err)
		}
		k := l.QueuePrefix(key) + strconv.FormatInt(int64(g.ID), 16)
		if _, err := cli.Put(ctx, k, v, clientv3.WithLease(g.ID)); err != nil {
			t.Fatal(err)
		}
		for _, opt := range []dlock.Option{dlock.WithShared(), dlock.WithLimit(1), dlock.WithLimit(3), dlock.WithTTL(2 * time.Second)} {
			if _, err := l.TryAcquire(ctx, key, opt); !errors.Is(err, dlock.ErrNotAcquired) {
				t.Errorf("value %q: TryAcquire = %v, want ErrNotAcquired", v, err)
			}
		}
		infos, err := l.List(ctx, key)
		if err != nil || len(infos) != 1 || infos[0].Mode != dlock.Exclusive || len(infos[0].Holders) != 1 {
			t.Errorf("value %q: List = %+v, %v; want one exclusive holder", v, infos, err)
		}
		if _, err := cli.Revoke(ctx, g.ID); err != nil {
			t.Fatal(err)
		}
		lk, err := l.TryAcquire(ctx, key, dlock.WithShared())
		if err != nil {
			t.Fatalf("value %q: shared TryAcquire once the entry is gone: %v", v, err)
		}
		rel(t, lk)
	}
}

// A semaphore wider than the waiters' per-key watches (17 permits): the
// waiters watch their queue's directory and are let in, in order, by the
// release of any entry within their window, and only then.
func TestSemaphoreWideWindow(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cli := newClient(t, c.Endpoints())
	l := etcdlock.New(newClient(t, c.Endpoints()))
	key := dlocktest.Key(t)
	const n = 17
	held := make([]*dlock.Lock, n)
	for i := range held {
		lk, err := l.Acquire(dlocktest.Context(t), key, dlock.WithLimit(n))
		if err != nil {
			t.Fatalf("permit %d: %v", i, err)
		}
		held[i] = lk
	}
	w1 := acquireBG(t, nil, l, key, dlock.WithLimit(n))
	awaitQueueLen(t, cli, l, key, n+1)
	w2 := acquireBG(t, nil, l, key, dlock.WithLimit(n))
	awaitQueueLen(t, cli, l, key, n+2)
	rel(t, held[0]) // outside the second waiter's window: lets in the first only
	p1 := got(t, w1, "first waiter after the oldest permit left")
	time.Sleep(300 * time.Millisecond)
	pending(t, w2, "second waiter while 17 hold")
	rel(t, p1) // inside the second waiter's window
	got(t, w2, "second waiter")
	for _, lk := range held[1:] {
		rel(t, lk)
	}
}

// Many readers TryAcquire a key that only readers hold, all at once, from
// separate clients: with no writer anywhere, every one of them must get
// it (a shared request is refused only by an exclusive holder or a
// waiting writer).
// Symptom: readers that TryAcquire together on a key only readers held were refused as held.
func TestShared_ConcurrentTryAcquireAllGranted(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	const n = 16
	ls := make([]*etcdlock.Locker, n)
	for i := range ls {
		ls[i] = etcdlock.New(newClient(t, c.Endpoints()))
	}
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	for round := 0; round < 3; round++ {
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make([]error, n)
		lks := make([]*dlock.Lock, n)
		for i := range ls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				lks[i], errs[i] = ls[i].TryAcquire(ctx, key, dlock.WithShared())
			}()
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("round %d reader %d refused while only readers hold: %v", round, i, err)
			}
		}
		for _, lk := range lks {
			if lk != nil {
				rel(t, lk)
			}
		}
		if t.Failed() {
			return
		}
	}
}

// The same for permits: n TryAcquire of a semaphore of n at once, from
// separate clients, on a free key: all are granted, and an n+1th is not.
// Symptom: permits that TryAcquire together on a free key granted beyond the limit, or refused below it.
func TestSemaphore_ConcurrentTryAcquireFillsExactly(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	const n = 8
	ls := make([]*etcdlock.Locker, n+4)
	for i := range ls {
		ls[i] = etcdlock.New(newClient(t, c.Endpoints()))
	}
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	var wg sync.WaitGroup
	start := make(chan struct{})
	var okN, refused atomic.Int32
	lks := make([]*dlock.Lock, len(ls))
	errs := make([]error, len(ls))
	for i := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			lks[i], errs[i] = ls[i].TryAcquire(ctx, key, dlock.WithLimit(n))
			if errs[i] == nil {
				okN.Add(1)
			} else if errors.Is(errs[i], dlock.ErrNotAcquired) {
				refused.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	if okN.Load() > n {
		t.Fatalf("%d permits of %d granted", okN.Load(), n)
	}
	if okN.Load() != n {
		t.Errorf("only %d of %d permits granted to %d concurrent TryAcquire on a free key: %v", okN.Load(), n, len(ls), errs)
	}
	for _, lk := range lks {
		if lk != nil {
			rel(t, lk)
		}
	}
}

// A semaphore of 1 is exclusive among permits, and a holder of another
// limit, a reader or a writer cannot join it; the permit's token is below
// the next writer's.
// Symptom: a semaphore of 1 admitting a second permit, a permit of another limit, a reader or a writer.
func TestSemaphore_LimitOneExcludesOtherPermitsAndModes(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	l := etcdlock.New(newClient(t, c.Endpoints()))
	l2 := etcdlock.New(newClient(t, c.Endpoints()))
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	p, err := l.TryAcquire(ctx, key, dlock.WithLimit(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l2.TryAcquire(ctx, key, dlock.WithLimit(1)); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("second permit of 1: %v", err)
	}
	if _, err := l.TryAcquire(ctx, key, dlock.WithLimit(1)); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("second permit of 1 on the same Locker: %v", err)
	}
	if _, err := l2.TryAcquire(ctx, key, dlock.WithLimit(2)); !errors.Is(err, dlock.ErrLimitMismatch) {
		t.Fatalf("permit of 2 on a semaphore of 1: %v", err)
	}
	if _, err := l2.TryAcquire(ctx, key, dlock.WithLimit(dlock.MaxLimit)); !errors.Is(err, dlock.ErrLimitMismatch) {
		t.Fatalf("permit of MaxLimit on a semaphore of 1: %v", err)
	}
	for _, o := range []dlock.Option{dlock.WithShared(), dlock.WithTTL(5 * time.Second)} {
		if _, err := l2.TryAcquire(ctx, key, o); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("other mode on a semaphore of 1: %v", err)
		}
	}
	wch := acquireBG(t, nil, l2, key)
	time.Sleep(300 * time.Millisecond)
	pending(t, wch, "writer behind a permit of 1")
	rel(t, p)
	w := got(t, wch, "writer")
	if w.Token() <= p.Token() {
		t.Fatalf("writer token %d <= permit's %d", w.Token(), p.Token())
	}
	rel(t, w)
	big, err := l.TryAcquire(ctx, key, dlock.WithLimit(dlock.MaxLimit))
	if err != nil {
		t.Fatalf("MaxLimit on a free key: %v", err)
	}
	rel(t, big)
}

// A permit whose holder died (its client gone, no release): a permit of
// another limit is refused with ErrLimitMismatch while that holder's lease
// lives, and granted, with a new limit, once it expired.
// Symptom: a dead holder's limit refusing permits of another limit after its lease expired.
func TestSemaphore_MismatchOnlyWhileOtherLimitHolderLives(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	dead := newClient(t, c.Endpoints())
	ld := etcdlock.New(dead)
	l := etcdlock.New(newClient(t, c.Endpoints()))
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	if _, err := ld.Acquire(ctx, key, dlock.WithLimit(3), dlock.WithTTL(time.Second)); err != nil {
		t.Fatal(err)
	}
	dead.Close() // no release, no renewal
	if _, err := l.TryAcquire(ctx, key, dlock.WithLimit(5)); !errors.Is(err, dlock.ErrLimitMismatch) {
		t.Fatalf("limit 5 against a live semaphore of 3: %v", err)
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var lk *dlock.Lock
	var err error
	for {
		lk, err = l.TryAcquire(actx, key, dlock.WithLimit(5))
		if err == nil || actx.Err() != nil {
			break
		}
		if !errors.Is(err, dlock.ErrLimitMismatch) && !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("unexpected: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("the dead semaphore of 3 still blocks a semaphore of 5: %v", err)
	}
	rel(t, lk)
}

// TryAcquire (which may join the queue and leave again) and Acquire of
// readers, permits and writers from several clients on one key: never a
// writer with anyone else, never more permits than the limit, never
// readers with permits; every TryAcquire that found only compatible
// holders and no conflicting newcomer gets in.
// Symptom: a TryAcquire that joins and leaves the queue letting a writer overlap, readers overlap permits, or permits exceed the limit.
func TestMixedModes_TryAcquireStressKeepsExclusion(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	const lockers, limit = 6, 3
	ls := make([]*etcdlock.Locker, lockers)
	for i := range ls {
		ls[i] = etcdlock.New(newClient(t, c.Endpoints()))
	}
	key := dlocktest.Key(t)
	var mu sync.Mutex
	var readers, permits, writers, grants int
	var bad []string
	check := func(dr, dp, dw int) {
		mu.Lock()
		defer mu.Unlock()
		readers, permits, writers = readers+dr, permits+dp, writers+dw
		if dr+dp+dw > 0 {
			grants++
		}
		if writers > 1 || (writers == 1 && readers+permits > 0) || permits > limit || (readers > 0 && permits > 0) {
			bad = append(bad, "readers "+itoa(readers)+" permits "+itoa(permits)+" writers "+itoa(writers))
		}
	}
	deadline := time.Now().Add(1500 * time.Millisecond)
	var wg sync.WaitGroup
	for g := 0; g < 12; g++ {
		wg.Go(func() {
			l := ls[g%lockers]
			for time.Now().Before(deadline) {
				var opt dlock.Option = dlock.WithTTL(5 * time.Second)
				dr, dp, dw := 0, 0, 0
				switch g % 4 {
				case 0, 1:
					opt, dp = dlock.WithLimit(limit), 1
				case 2:
					opt, dr = dlock.WithShared(), 1
				default:
					dw = 1
				}
				var lk *dlock.Lock
				var err error
				ctx, cancel := ctxFor(2 * time.Second)
				if g < 6 {
					lk, err = l.TryAcquire(ctx, key, opt)
				} else {
					lk, err = l.Acquire(ctx, key, opt)
				}
				cancel()
				if err != nil {
					// ErrUnavailable: a request timed out on a loaded machine.
					if !errors.Is(err, dlock.ErrNotAcquired) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, dlock.ErrUnavailable) {
						t.Errorf("attempt: %v", err)
						return
					}
					time.Sleep(5 * time.Millisecond)
					continue
				}
				check(dr, dp, dw)
				time.Sleep(10 * time.Millisecond)
				check(-dr, -dp, -dw)
				if err := lk.Release(dlocktest.Context(t)); err != nil {
					t.Errorf("release: %v", err)
				}
			}
		})
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("%d violations, first: %s", len(bad), bad[0])
	}
	if grants == 0 {
		t.Fatal("no grants")
	}
	t.Logf("%d grants", grants)
	// Nothing left behind: a writer gets the key at once.
	w, err := ls[0].TryAcquire(dlocktest.Context(t), key)
	if err != nil {
		time.Sleep(time.Second) // background removal of refused joins
		if w, err = ls[0].TryAcquire(dlocktest.Context(t), key); err != nil {
			t.Fatalf("key still held after the stress: %v", err)
		}
	}
	rel(t, w)
}

func itoa(n int) string { return strconv.Itoa(n) }

// concurrency.Mutex TryLock and Lock race with dlock readers that
// TryAcquire (and so may join the queue and leave it again) and Acquire:
// a Mutex never holds together with a dlock reader.
// Symptom: a concurrency.Mutex holding together with a dlock reader that joined the queue.
func TestShared_ConcurrencyMutexNeverHoldsWithReader(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	key := dlocktest.Key(t)
	var mu sync.Mutex
	var readers, mutexes int
	var bad []string
	check := func(dr, dm int) {
		mu.Lock()
		defer mu.Unlock()
		readers, mutexes = readers+dr, mutexes+dm
		if mutexes > 1 || (mutexes == 1 && readers > 0) {
			bad = append(bad, "readers "+itoa(readers)+" mutexes "+itoa(mutexes))
		}
	}
	deadline := time.Now().Add(1500 * time.Millisecond)
	var wg sync.WaitGroup
	for g := 0; g < 3; g++ {
		cli := newClient(t, c.Endpoints())
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		wg.Go(func() {
			for time.Now().Before(deadline) {
				m := concurrency.NewMutex(s, key)
				ctx, cancel := ctxFor(2 * time.Second)
				var err error
				if g == 0 {
					err = m.TryLock(ctx)
				} else {
					err = m.Lock(ctx)
				}
				if err == nil {
					check(0, 1)
					time.Sleep(5 * time.Millisecond)
					check(0, -1)
					_ = m.Unlock(context.Background())
				} else if !errors.Is(err, concurrency.ErrLocked) && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("mutex: %v", err)
				}
				cancel()
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	for g := 0; g < 6; g++ {
		l := etcdlock.New(newClient(t, c.Endpoints()))
		wg.Go(func() {
			for time.Now().Before(deadline) {
				ctx, cancel := ctxFor(2 * time.Second)
				var lk *dlock.Lock
				var err error
				if g < 4 {
					lk, err = l.TryAcquire(ctx, key, dlock.WithShared())
				} else {
					lk, err = l.Acquire(ctx, key, dlock.WithShared())
				}
				cancel()
				if err != nil {
					if !errors.Is(err, dlock.ErrNotAcquired) && !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("reader: %v", err)
					}
					time.Sleep(2 * time.Millisecond)
					continue
				}
				check(1, 0)
				time.Sleep(5 * time.Millisecond)
				check(-1, 0)
				_ = lk.Release(context.Background())
			}
		})
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("%d violations, first: %s", len(bad), bad[0])
	}
}
