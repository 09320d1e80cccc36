package redlock_test

import (
	"context"
	"errors"
	"fmt"
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

// A key that a release reserved for the waiter it woke (every node holds
// the reservation marker |0|<wait id>|<until ms>): a TryAcquire by
// someone else is refused and names the reservation: no holder, the
// waiter's id in the metadata, the reservation left as TTL. The markers
// are written on the nodes directly, with a reservation long enough that
// the attempt always comes within it (a release's lasts 100ms, which a
// starved test process can miss).
func TestTryAcquire_NamesReservation(t *testing.T) {
	c := startNodes(t, 3)
	other := c.locker(t)
	key := dlocktest.Key(t)
	const id, left = "1700000000000000-0a1b2c3d", time.Minute
	for i, a := range c.admin {
		now, err := a.Time(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		marker := fmt.Sprintf("|0|%s|%d", id, now.Add(left).UnixMilli())
		if err := a.Set(context.Background(), lockKey(key), marker, left).Err(); err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
	}
	_, err := other.TryAcquire(dlocktest.Context(t), key)
	var na *dlock.NotAcquiredError
	if !errors.As(err, &na) {
		t.Fatalf("TryAcquire of a reserved key = %v, want a *dlock.NotAcquiredError", err)
	}
	if len(na.Holders) == 0 || na.Holders[0].Owner != "" || na.Holders[0].Metadata[redlock.MetaReservedForWaiter] != id {
		t.Fatalf("TryAcquire of a key reserved for waiter %s: holders %+v", id, na.Holders)
	}
	if ttl := na.Holders[0].TTL; ttl <= 0 || ttl > left {
		t.Fatalf("TTL %v, want the reservation left, within (0, %v]", ttl, left)
	}
	if msg := err.Error(); !strings.Contains(msg, "reserved for waiter "+id) {
		t.Fatalf("message %q does not name the reservation", msg)
	}
}
