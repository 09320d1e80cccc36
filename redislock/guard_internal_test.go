package redislock

import (
	"context"
	"errors"
	"testing"

	"github.com/dlock-go/dlock"
)

// Symptom: Highest returned a plain error, not ErrUnavailable, when the client gave up at the deadline before the Guard abandoned the call.
func TestFenceReply_ClientGivingUpAtDeadlineIsUnavailable(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := fenceReply(ctx, "res", "fence-key", "", context.Canceled, false)
	if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Fatalf("fenceReply after the client gave up = %v, want an error wrapping dlock.ErrUnavailable and context.Canceled", err)
	}
	// A client error while the context is still live is the client's own.
	_, err = fenceReply(context.Background(), "res", "fence-key", "", errors.New("boom"), false)
	if err == nil || errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("fenceReply of a live call's error = %v, want a plain error", err)
	}
}
