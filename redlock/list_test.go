package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/redlock"
)

// List returns by its context's deadline when nodes do not answer.
func TestListReturnsByDeadline(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{0, 1})
	t.Cleanup(link.Heal)
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	// Acquire returns once a majority granted: a grant to node 1 that
	// lands after the heal below would leave List, with node 0 stalled,
	// seeing the lease on node 2 alone and listing nothing.
	heldOnAll(t, c, key, lk)
	link.Stall() // a majority
	const d = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	_, err = l.List(ctx, "")
	over := time.Since(start) - d
	t.Logf("List with a majority stalled: returned %v after its deadline: %v", over.Round(10*time.Microsecond), err)
	if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("List = %v, want ErrUnavailable and the deadline", err)
	}
	if over > dlocktest.OverrunBound {
		t.Fatalf("List overran its deadline by %v", over)
	}
	// A minority stalled: the majority answers. The stalled node never
	// will, so a List that waited for it would end in an error at this
	// deadline; it is generous so that a loaded machine's slow answers
	// are not mistaken for that (300ms can run out on one).
	link[1].Heal()
	ctx2, cancel2 := context.WithTimeout(context.Background(), dlocktest.HangTimeout)
	defer cancel2()
	infos, err := l.List(ctx2, key)
	if err != nil || len(infos) != 1 || len(infos[0].Holders) != 1 || infos[0].Holders[0].Owner != lk.Owner() {
		t.Fatalf("List with a minority stalled = %+v, %v", infos, err)
	}
}

// List(prefix) returns only keys starting with prefix, also when prefix
// contains '}': the SCAN pattern "dlock:{a}*" matches the lock key of
// "a" itself ("dlock:{a}") on every node.
// Symptom: List("a}") listed the lock of "a" itself.
func TestList_PrefixWithBraceMatchesOnlyItsKeys(t *testing.T) {
	c := startNodes(t, 3)
	l := c.locker(t)
	base := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), base)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	with, err := l.Acquire(dlocktest.Context(t), base+"}x")
	if err != nil {
		t.Fatal(err)
	}
	defer with.Release(context.Background())
	infos, err := l.List(dlocktest.Context(t), base+"}")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 1 || infos[0].Key != base+"}x" {
		t.Fatalf("List(%q) = %+v, want only %q", base+"}", infos, base+"}x")
	}
}

// TestList_HeldForExcludesTheWaitAndIsNeverNegative: redlock's List derives HeldFor from the
// winning attempt's MetaAcquired: ≥ 0, at most the time since the call,
// not counting a wait; concurrent acquire/list (run with -race).
func TestList_HeldForExcludesTheWaitAndIsNeverNegative(t *testing.T) {
	c := startNodes(t, 3)
	l := c.locker(t)
	ctx := dlocktest.Context(t)
	heldFor := func(key string) time.Duration {
		t.Helper()
		infos, err := l.List(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range infos {
			if in.Key == key && len(in.Holders) == 1 {
				return in.Holders[0].HeldFor
			}
		}
		t.Fatalf("List(%q) = %+v: want one holder", key, infos)
		return 0
	}
	key := dlocktest.Key(t)
	before := time.Now()
	lk, err := l.TryAcquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if h, most := heldFor(key), time.Since(before)+time.Millisecond; h < 0 || h > most {
		t.Errorf("HeldFor %v, want in [0, %v]", h, most)
	}
	// A waiter: its wait is not counted.
	const hold = time.Second
	called := time.Now()
	got := make(chan *dlock.Lock, 1)
	go func() {
		lk2, err := c.locker(t).Acquire(ctx, key, dlock.WithWait(20*time.Second))
		if err != nil {
			t.Error(err)
		}
		got <- lk2
	}()
	time.Sleep(hold)
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if lk2 := <-got; lk2 != nil {
		if h := heldFor(key); h < 0 || h > time.Since(called)-hold/2 {
			t.Errorf("HeldFor %v after a wait of %v: the wait is counted", h, hold)
		}
		_ = lk2.Release(ctx)
	}
	// User "acquired" values never make HeldFor negative.
	for i, v := range []string{"junk", "-1", "99999999999999999999", fmt.Sprint(time.Now().Add(time.Hour).UnixMilli())} {
		k := fmt.Sprintf("%s.%d", key, i)
		lk, err := l.TryAcquire(ctx, k, dlock.WithMetadata(dlock.MetaAcquired, v))
		if err != nil {
			t.Fatal(err)
		}
		if h := heldFor(k); h < 0 {
			t.Errorf("acquired=%q: HeldFor %v", v, h)
		}
		_ = lk.Release(ctx)
	}
	// Race: acquire, list, release from many goroutines.
	start := time.Now()
	var wg sync.WaitGroup
	for g := 0; g < 6; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := c.locker(t)
			for i := 0; i < 5; i++ {
				k := fmt.Sprintf("%s.race.%d", key, i%2)
				lk, err := l.Acquire(ctx, k, dlock.WithWait(20*time.Second))
				if err != nil {
					t.Error(err)
					return
				}
				infos, err := l.List(ctx, key+".race.")
				if err != nil {
					t.Error(err)
				}
				for _, in := range infos {
					for _, h := range in.Holders {
						if h.HeldFor < 0 || h.HeldFor > time.Since(start)+time.Millisecond {
							t.Errorf("%s: HeldFor %v out of [0, %v]", in.Key, h.HeldFor, time.Since(start))
						}
					}
				}
				_ = lk.Release(ctx)
			}
		}()
	}
	wg.Wait()
}

// List right after Release: with node 2 merely delayed the key is free;
// with node 2 hung, the lease left on node 2 alone (a minority) is not a
// holder per List's doc ("a majority of nodes hold for the same owner").
func TestList_KeyFreeRightAfterRelease(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{2}, redlock.WithNodeTimeout(time.Second))
	for _, mode := range []string{"delayed", "hung"} {
		key := dlocktest.Key(t) + mode
		lk, err := l.Acquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatal(err)
		}
		heldOnAll(t, c, key, lk)
		if mode == "delayed" {
			link[0].Delay(5 * time.Millisecond)
		} else {
			link.Stall()
		}
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Fatalf("%s: Release: %v", mode, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		start := time.Now()
		infos, err := l.List(ctx, key)
		cancel()
		t.Logf("%s: List right after Release: %v, %v after %v; remnants %v", mode, infos, err, time.Since(start), nodesHolding(t, c, key, lk.Owner(), 0, 1, 2))
		if err != nil && mode == "delayed" {
			t.Errorf("%s: List: %v", mode, err)
		}
		if len(infos) != 0 {
			t.Errorf("%s: List right after Release shows %v, want the key free", mode, infos)
		}
		link.Heal()
	}
}
