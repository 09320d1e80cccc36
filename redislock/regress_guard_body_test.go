package redislock_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

type rejections struct {
	mu sync.Mutex
	n  int
}

func (r *rejections) Observe(e dlock.Event) {
	if e.Kind == dlock.EventRejected {
		r.mu.Lock()
		r.n++
		r.mu.Unlock()
	}
}

// An Eval body's own error reply is the body's error, never a refusal:
// a body returning an error that reads like the guard's refusal
// ("DLOCKSTALE 3", say a value or a pcall's error it passes on) was
// reported as a *dlock.StaleTokenError and an EventRejected although its
// fence was admitted and recorded. (Red-team reproducer.)
func TestRegressGuardEvalBodyErrorIsNotRefusal(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	c := newClient(t, srv)
	var obs rejections
	g := redislock.NewGuard(c, dlock.WithObserver(&obs))
	ctx := dlocktest.Context(t)
	res := dlocktest.Key(t)
	f := dlock.Fence{Token: 5, Owner: "a"}
	for _, body := range []string{
		`return redis.error_reply('DLOCKSTALE 3')`,
		`return {err = 'DLOCKSTALE 3'}`,
		`return redis.error_reply(ARGV[1])`,
	} {
		_, err := g.Eval(ctx, res, f, body, nil, "DLOCKSTALE 3")
		if err == nil || errors.Is(err, dlock.ErrStaleToken) {
			t.Errorf("Eval(%s) with an admitted fence = %v, want the body's error, not a refusal", body, err)
		}
	}
	if obs.n != 0 {
		t.Errorf("%d EventRejected reported for admitted fences", obs.n)
	}
	if hi, err := g.Highest(ctx, res); err != nil || hi != f {
		t.Fatalf("Highest = %+v, %v; want %+v", hi, err, f)
	}
	// A body's ordinary error and a real refusal keep their meaning.
	if _, err := g.Eval(ctx, res, f, `return redis.error_reply('MYERR boom')`, nil); err == nil || errors.Is(err, dlock.ErrStaleToken) {
		t.Errorf("body error = %v", err)
	}
	var st *dlock.StaleTokenError
	if _, err := g.Eval(ctx, res, dlock.Fence{Token: 4, Owner: "b"}, `return 1`, nil); !errors.As(err, &st) || st.Highest != 5 {
		t.Errorf("older fence = %v, want a StaleTokenError with highest 5", err)
	}
	if obs.n != 1 {
		t.Errorf("%d EventRejected, want 1", obs.n)
	}
}
