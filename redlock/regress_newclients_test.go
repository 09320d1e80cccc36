package redlock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redlock"
)

// wrappedClient is a client wrapper passed by value that Go cannot compare
// (it has a slice field), as an application may write to add behaviour
// around a *redis.Client.
type wrappedClient struct {
	*redis.Client
	tags []string
}

// New never panics on its clients: a client of a type that cannot be a
// map key made New's duplicate check panic ("hash of unhashable type").
// (Red-team reproducer.)
func TestRegressNewUncomparableClient(t *testing.T) {
	var cls []redis.UniversalClient
	for range 3 {
		c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
		t.Cleanup(func() { c.Close() })
		cls = append(cls, wrappedClient{Client: c, tags: []string{"x"}})
	}
	var l *redlock.Locker
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("redlock.New panicked: %v", r)
			}
		}()
		l = redlock.New(cls)
	}()
	if l.Quorum() != 2 {
		t.Fatalf("Quorum = %d, want 2", l.Quorum())
	}
	// The mode check comes before any I/O to the (unreachable) nodes.
	if _, err := l.TryAcquire(context.Background(), "k", dlock.WithShared()); !errors.Is(err, dlock.ErrUnsupported) {
		t.Fatalf("TryAcquire(WithShared) = %v, want ErrUnsupported", err)
	}
	// The same comparable client twice is still refused.
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { c.Close() })
	if _, err := redlock.New([]redis.UniversalClient{c, cls[0], c}).TryAcquire(context.Background(), "k"); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Fatalf("a client listed twice: %v, want ErrInvalidOption", err)
	}
}

// Regression (red team, issue 10): Quorum on the zero Locker, or on one
// New refused, panicked.
func TestRegressQuorumOfZeroLocker(t *testing.T) {
	var zero redlock.Locker
	if q := zero.Quorum(); q != 0 {
		t.Fatalf("zero Locker quorum %d", q)
	}
	_ = redlock.New(nil).Quorum() // must not panic
}
