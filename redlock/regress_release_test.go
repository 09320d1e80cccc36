package redlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
)

// A Redlock release takes effect on every node but every reply is lost
// (Release returns an error). The key then changes hands once. The caller
// retries Release ("after a network error the next call retries"); the
// promise is that a release whose reply was lost is reported released,
// never lost.
func TestRegressReleaseRetryAfterHandover(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{0, 1, 2})
	other := c.locker(t)
	key := dlocktest.Key(t)

	w, err := l.Acquire(dlocktest.Context(t), key) // warm up the script cache
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	// go-redis resends a script on a new connection after a short random
	// backoff; if a majority of resends got through before the links were
	// cut, the replies were not lost: try again (bounded).
	var lk *dlock.Lock
	for round := 0; ; round++ {
		if lk, err = l.Acquire(dlocktest.Context(t), key); err != nil {
			t.Fatal(err)
		}
		err1 := c.loseReleaseReplies(link, key, func() error { return lk.Release(dlocktest.Context(t)) })
		t.Logf("first Release: %v; nodes: %q", err1, c.holders(t, key))
		if err1 != nil {
			break
		}
		if round == 9 {
			t.Skip("the replies were never lost")
		}
	}
	o, err := other.TryAcquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Release(context.Background())
	err2 := lk.Release(dlocktest.Context(t))
	if errors.Is(err2, dlock.ErrLockLost) || errors.Is(err2, dlock.ErrNotHeld) {
		t.Fatalf("retried Release of a lock released cleanly reports it lost: %v", err2)
	}
	if err2 != nil {
		t.Fatalf("retried Release: %v", err2)
	}
}

// loseReleaseReplies runs release with every node's reply lost, and keeps
// the links dead until go-redis has given up resending: every node
// released, the client got errors (unless resends reached a majority
// before the links were cut; then release returns nil).
func (c *cluster) loseReleaseReplies(link testserver.Proxies, key string, release func() error) error {
	cut := make(chan struct{})
	go func() {
		defer close(cut)
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
			n := 0
			for _, a := range c.admin {
				if v, _ := a.Get(context.Background(), lockKey(key)).Result(); strings.HasPrefix(v, "|") {
					n++
				}
			}
			if n == len(c.srvs) {
				link.Cut()
				return
			}
			time.Sleep(200 * time.Microsecond)
		}
	}()
	link.LoseNextReply()
	err := release()
	<-cut
	link.Heal()
	return err
}
