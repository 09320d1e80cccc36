package dlock

import (
	"context"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/background"
)

// callResult is what a backend call returned.
type callResult[T any] struct {
	v   T
	err error
}

// call runs f(ctx) and returns its result, or returns as soon as ctx is
// done even when f has not: a backend client that does not watch the
// context (a default go-redis client on a stalled link waits for its own
// read timeout and retries) cannot hold the caller past its deadline.
// abandoned reports that case; f then goes on in the background and, when
// it returns, late (if not nil) gets its result on f's goroutine, so that a
// request that took effect after all can be undone.
//
// With a context that can never be done, f runs on the caller's goroutine.
func call[T any](ctx context.Context, f func(context.Context) (T, error), late func(T, error)) (v T, err error, abandoned bool) {
	return callGrace(ctx, realClock{}, 0, f, late)
}

// queueGrace is how long a queue wait (Queuer.Queue) may take to return
// on its own once its context is done, before the core abandons it. A
// queue wait blocks by design and ends with a *NotAcquiredError naming
// the holder it waited behind; the grace lets that honest answer arrive
// (a backend honouring its context returns within microseconds). A
// backend stuck in a request overruns the context by at most this much.
const queueGrace = 100 * time.Millisecond

// callGrace is call, giving f up to grace (on clk) after ctx is done to
// return on its own.
func callGrace[T any](ctx context.Context, clk clock, grace time.Duration, f func(context.Context) (T, error), late func(T, error)) (v T, err error, abandoned bool) {
	if d, ok := ctx.Deadline(); ok && ctx.Done() == nil {
		// A hand-written context with a deadline but no Done channel.
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d)
		defer cancel()
	}
	if ctx.Done() == nil {
		v, err = f(ctx)
		return v, err, false
	}
	if err := ctx.Err(); err != nil {
		return v, err, false // nothing was sent
	}
	var (
		mu   sync.Mutex
		left bool // the caller stopped waiting
		ch   = make(chan callResult[T], 1)
	)
	background.Go(func() {
		v, err := f(ctx)
		mu.Lock()
		gone := left
		if !gone {
			ch <- callResult[T]{v, err} // buffered: never blocks
		}
		mu.Unlock()
		if gone && late != nil {
			late(v, err)
		}
	})
	select {
	case r := <-ch:
		return r.v, r.err, false
	case <-ctx.Done():
		if grace > 0 {
			t, expired := clk.NewTimer(grace)
			select {
			case r := <-ch:
				t.Stop()
				return r.v, r.err, false
			case <-expired:
			}
		}
		mu.Lock()
		defer mu.Unlock()
		select {
		case r := <-ch: // it finished meanwhile
			return r.v, r.err, false
		default:
			left = true
			return v, ctxErr(ctx), true
		}
	}
}
