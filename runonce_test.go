package dlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

// A lease TTL equal to atLeastFor is valid whatever its sub-millisecond
// part: the TTL is kept in whole milliseconds, and comparing the
// truncated TTL with the untruncated atLeastFor refused the call with
// ErrInvalidOption (a 6.667s lease, two thirds of a session timeout).
func TestRunOnce_AcceptsTTLOfAtLeastFor_SubMillisecond(t *testing.T) {
	atLeast := 6*time.Second + 666*time.Millisecond + 666_666
	ran, err := dlock.RunOnce(context.Background(), memlock.New(), "k", 10*time.Second, atLeast,
		func(context.Context) error { return nil }, dlock.WithTTL(atLeast))
	if !ran || err != nil {
		t.Fatalf("RunOnce with WithTTL(atLeastFor = %v): ran=%v err=%v, want it run", atLeast, ran, err)
	}
}
