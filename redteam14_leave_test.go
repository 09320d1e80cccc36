package dlock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// rt14Writers is a lock service whose key is always held and that records
// waiting writers (driver: Writer preference, without a queue), the way a
// network backend does; an attempt can be made to hang, ignoring its
// context, until a gate closes (a stalled link), after which it reaches the
// server and registers its waiter. It tests the core's wiring of
// Request.Waiter and Leaver; the backends are tested against real servers.
type rt14Writers struct {
	mu      sync.Mutex
	writers map[string]bool
	tries   int
	gate    chan struct{} // the attempt after the first one hangs on it
	late    chan struct{} // closed once that attempt has registered
}

func (d *rt14Writers) Spec() driver.Spec { return driver.Spec{Name: "rt14writers"} }

func (d *rt14Writers) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	d.mu.Lock()
	d.tries++
	n := d.tries
	d.mu.Unlock()
	if n == 2 {
		<-d.gate // ignores ctx: the reply is on its way
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if req.Waiter != "" {
		d.writers[req.Waiter] = true
	}
	if n == 2 {
		close(d.late)
	}
	return driver.Grant{}, &dlock.NotAcquiredError{Key: req.Key, Holders: []dlock.Holder{{Owner: "someone", TTL: time.Minute}}}
}

func (d *rt14Writers) Leave(ctx context.Context, key, waiter string) error {
	d.mu.Lock()
	delete(d.writers, waiter)
	d.mu.Unlock()
	return nil
}

func (d *rt14Writers) registered() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.writers)
}

// A waiting writer whose Acquire ended while an attempt was in flight (and
// abandoned) must not stay registered: the core called Leave as soon as the
// Acquire ended, before the abandoned attempt reached the server and
// registered the writer again, keeping readers out for a TTL for a writer
// that had given up (driver.Leaver: "stops keeping readers out at once").
func TestRedTeam14_AbandonedAttemptDoesNotOrphanWriter(t *testing.T) {
	d := &rt14Writers{writers: map[string]bool{}, gate: make(chan struct{}), late: make(chan struct{})}
	e := dlock.NewEngine(d)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	// TTL 300ms: attempts at least every 100ms, so the second one is
	// under way (and hangs) when the context ends.
	if _, err := e.Acquire(ctx, "rt14/w", dlock.WithTTL(300*time.Millisecond)); err == nil {
		t.Fatal("acquired a held key")
	}
	// The Acquire has returned; its Leave runs in the background.
	deadline := time.Now().Add(2 * time.Second)
	for d.registered() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if d.registered() != 0 {
		t.Fatal("the registration stayed after the Acquire ended")
	}
	close(d.gate) // the abandoned attempt now reaches the server
	<-d.late
	deadline = time.Now().Add(2 * time.Second)
	for d.registered() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := d.registered(); n != 0 {
		t.Errorf("the abandoned attempt left the writer registered (%d) after its Acquire had ended and left", n)
	}
}
