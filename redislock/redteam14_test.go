package redislock_test

import (
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
)

// TestRedTeam14_LostPermitReleaseReply (held up): the last permit's
// release whose reply is lost succeeds on retry (its receipt), leaves
// the key free for another mode, and the next token is above it.
func TestRedTeam14_LostPermitReleaseReply(t *testing.T) {
	t.Parallel()
	env := standaloneEnv(t)
	l, link := env.Proxied(t)
	key := dlocktest.Key(t)
	p1 := mustTry(t, l, key, dlock.WithLimit(2))
	p2 := mustTry(t, l, key, dlock.WithLimit(2))
	link.LoseNextReply()
	if err := p1.Release(dlocktest.Context(t)); err != nil {
		t.Fatalf("permit release with its reply lost: %v", err)
	}
	link.LoseNextReply()
	if err := p2.Release(dlocktest.Context(t)); err != nil {
		t.Fatalf("last permit release with its reply lost: %v", err)
	}
	w := mustTry(t, env.New(t), key)
	if w.Token() <= p2.Token() {
		t.Fatalf("writer token %d not above the last permit's %d", w.Token(), p2.Token())
	}
	mustRelease(t, w)
}
