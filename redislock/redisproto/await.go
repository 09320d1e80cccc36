package redisproto

import (
	"context"

	"github.com/dlock-go/dlock/internal/background"
)

// Await runs f and returns its result, or returns as soon as ctx is done
// (abandoned true, err the context's cause) even when f has not: go-redis
// clients without ContextTimeoutEnabled wait on a stalled link for their
// read timeout and retries whatever the context says. An abandoned f goes
// on in the background until the client gives up; its result is dropped.
func Await[T any](ctx context.Context, f func(context.Context) (T, error)) (v T, err error, abandoned bool) {
	if ctx.Done() == nil {
		v, err = f(ctx)
		return v, err, false
	}
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1) // buffered: an abandoned f never blocks
	background.Go(func() {
		v, err := f(ctx)
		ch <- result{v, err}
	})
	select {
	case r := <-ch:
		return r.v, r.err, false
	case <-ctx.Done():
		select {
		case r := <-ch: // finished meanwhile
			return r.v, r.err, false
		default:
			return v, context.Cause(ctx), true
		}
	}
}
