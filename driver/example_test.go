package driver_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// one is the smallest driver: one process, exclusive locks only, no
// notifications (the Engine polls with backoff). memlock is the complete
// reference.
type one struct {
	mu     sync.Mutex
	tokens map[string]uint64
	owners map[string]string
}

func (d *one) Spec() driver.Spec { return driver.Spec{Name: "one"} }

func (d *one) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if o, held := d.owners[req.Key]; held && o != req.Owner {
		return driver.Grant{}, &dlock.NotAcquiredError{Key: req.Key, Holders: []dlock.Holder{{Owner: o, Token: d.tokens[req.Key]}}}
	}
	if _, held := d.owners[req.Key]; !held {
		d.tokens[req.Key]++
		d.owners[req.Key] = req.Owner
	}
	return driver.Grant{Lease: &lease{d, req.Key, req.Owner}, Token: d.tokens[req.Key]}, nil
}

type lease struct {
	d          *one
	key, owner string
}

func (l *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	l.d.mu.Lock()
	defer l.d.mu.Unlock()
	if l.d.owners[l.key] != l.owner {
		return dlock.ErrNotHeld
	}
	return nil // a real driver extends the server-side lease to ttl
}

func (l *lease) Release(ctx context.Context) error {
	l.d.mu.Lock()
	defer l.d.mu.Unlock()
	if l.d.owners[l.key] == l.owner {
		delete(l.d.owners, l.key)
	}
	return nil
}

// A backend wraps its driver in a dlock.Engine, which supplies the wait
// loop, the watchdog, the Lock handle and the Observer calls.
func Example() {
	e := dlock.NewEngine(&one{tokens: map[string]uint64{}, owners: map[string]string{}})
	ctx := context.Background()

	a, _ := e.TryAcquire(ctx, "k")
	_, err := e.TryAcquire(ctx, "k")
	fmt.Println("second holder refused:", err != nil)
	_, err = e.TryAcquire(ctx, "k", dlock.WithShared())
	fmt.Println(err)
	a.Release(ctx)
	b, _ := e.TryAcquire(ctx, "k")
	fmt.Println("tokens:", a.Token(), b.Token())
	b.Release(ctx)
	// Output:
	// second holder refused: true
	// dlock: not supported: the one backend does not offer shared locks ("k")
	// tokens: 1 2
}
