package redlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/redlock"
)

// A node whose key is reserved for a woken waiter is reported as such,
// not as "held by unknown holder".
func TestQuorumErrorNamesReservation(t *testing.T) {
	qe := &redlock.QuorumError{Op: "acquire", Key: "k", Quorum: 2, Results: []redlock.NodeResult{
		{Node: "a", Outcome: redlock.OutcomeHeld, Metadata: map[string]string{redlock.MetaReservedForWaiter: "w1"}},
		{Node: "b", Outcome: redlock.OutcomeHeld, Holder: "0123456789abcdef"},
		{Node: "c", Outcome: redlock.OutcomeGranted},
	}}
	want := `dlock: redlock acquire "k": 1/3 nodes granted, need 2; a: reserved for waiter w1; b: held by owner 0123456789ab`
	if got := qe.Error(); got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
}

// While the releases reserve the key for the waiter they woke, a
// TryAcquire by someone else names the reservation: no holder, the
// waiter's id in the metadata, the reservation left as TTL.
func TestRegressReservationReported(t *testing.T) {
	c := startNodes(t, 3)
	holder := c.locker(t)
	waiterL, link := c.lockerVia(t, []int{0, 1, 2})
	t.Cleanup(link.Heal)
	other := c.locker(t)
	// The reservation lasts 100ms: if the TryAcquire comes later than
	// that (a slow machine), it gets the key; then try again (bounded).
	for round := 0; ; round++ {
		key := dlocktest.Key(t)
		lk, err := holder.Acquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatal(err)
		}
		waiting := make(chan error, 1)
		go func() {
			w, err := waiterL.Acquire(dlocktest.Context(t), key)
			if err == nil {
				err = w.Release(context.Background())
			}
			waiting <- err
		}()
		// Queued on every node (bounded).
		var id string
		for end := time.Now().Add(dlocktest.HangTimeout); ; time.Sleep(5 * time.Millisecond) {
			n := 0
			for _, a := range c.admin {
				if ids, _ := a.ZRange(context.Background(), lockKey(key)+":waiters", 0, -1).Result(); len(ids) == 1 {
					n++
					id = ids[0]
				}
			}
			if n == len(c.admin) {
				break
			}
			if time.Now().After(end) {
				t.Fatal("hang: the waiter was not queued on every node")
			}
		}
		link.Stall() // the waiter's host hangs: the key stays reserved
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Fatal(err)
		}
		o, err := other.TryAcquire(dlocktest.Context(t), key)
		link.Heal()
		if err == nil {
			t.Logf("round %d: the reservation ended before the TryAcquire", round)
			if err := o.Release(dlocktest.Context(t)); err != nil {
				t.Fatal(err)
			}
			if err := <-waiting; err != nil {
				t.Fatal(err)
			}
			if round == 9 {
				t.Skip("the TryAcquire never came within the reservation")
			}
			continue
		}
		if err := <-waiting; err != nil {
			t.Fatal(err)
		}
		t.Logf("TryAcquire: %v", err)
		var na *dlock.NotAcquiredError
		if !errors.As(err, &na) {
			t.Fatalf("TryAcquire of a reserved key = %v, want a *dlock.NotAcquiredError", err)
		}
		// The holder seen on most nodes comes first.
		if len(na.Holders) == 0 || na.Holders[0].Owner != "" || na.Holders[0].Metadata[redlock.MetaReservedForWaiter] != id {
			t.Fatalf("TryAcquire of a key reserved for waiter %s: holders %+v", id, na.Holders)
		}
		if ttl := na.Holders[0].TTL; ttl <= 0 || ttl > 100*time.Millisecond {
			t.Fatalf("TTL %v, want the reservation left, within (0, 100ms]", ttl)
		}
		if msg := err.Error(); !strings.Contains(msg, "reserved for waiter "+id) {
			t.Fatalf("message %q does not name the reservation", msg)
		}
		return
	}
}
