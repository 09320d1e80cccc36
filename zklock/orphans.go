// Orphan deletion: a queue node nobody uses any more (see Orphans) is
// deleted in the background and retried until it is gone; deleteOwner
// deletes every node of one attempt (Abort).

package zklock

import (
	"context"
	"errors"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/background"
)

// Orphans: a node nobody uses any more (a waiter that gave up, an attempt
// that found the key held, a lost lock whose release failed) must be
// deleted, or it holds the key for as long as the session lives, and the
// client's pings keep the session alive. So the deletion is retried in the
// background until it succeeds or the node is gone with its session.
const (
	// orphanRetryFor bounds the retries of one deletion.
	orphanRetryFor = 2 * time.Minute
	// orphanBackoff is the longest pause between two tries.
	orphanBackoff = time.Second
)

// abandon deletes e's node in the background (see Orphans). At most one
// deletion runs per node.
func (e *entry) abandon() {
	e.mu.Lock()
	if e.deleting || e.deletedByUs {
		e.mu.Unlock()
		return
	}
	e.deleting = true
	e.mu.Unlock()
	background.Go(e.deleteOrphan)
}

func (e *entry) deleteOrphan() {
	if h := e.b.hooks.Load(); h != nil && h.beforeOrphanDelete != nil {
		h.beforeOrphanDelete()
	}
	deleted := e.b.retryDelete(e.sid, func(ctx context.Context) (bool, error) {
		_, err := call(ctx, e.b, "delete", func() (struct{}, error) {
			return struct{}{}, e.b.conn.Delete(e.path, -1)
		})
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, zk.ErrNoNode):
			return false, nil
		}
		return false, err
	})
	e.mu.Lock()
	if deleted || e.unsure {
		e.deletedByUs = true
	}
	e.deleting = false
	e.mu.Unlock()
}

// abandonStarted is abandon, returning a channel closed once the deletion
// it started ends (at once if one ran or runs already).
func (e *entry) abandonStarted() <-chan struct{} {
	done := make(chan struct{})
	e.mu.Lock()
	if e.deleting || e.deletedByUs {
		e.mu.Unlock()
		close(done)
		return done
	}
	e.deleting = true
	e.mu.Unlock()
	background.Go(func() {
		defer close(done)
		e.deleteOrphan()
	})
	return done
}

// abandonWithin is abandon, waiting up to d for the deletion to finish.
func (e *entry) abandonWithin(d time.Duration) {
	done := e.abandonStarted()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// waitDeleted waits for a deletion started by abandonStarted to end, at
// most until ctx ends or for the request timeout: past that it goes on in
// the background (see Orphans).
func (b *backend) waitDeleted(ctx context.Context, gone <-chan struct{}) {
	t := time.NewTimer(b.timeout)
	defer t.Stop()
	select {
	case <-gone:
	case <-ctx.Done():
	case <-t.C:
	}
}

// abandonOwner deletes, in the background, every queue node of owner under
// dir: an attempt whose outcome is unknown and could not be undone at once
// (the ensemble hung or was unreachable) may still create one, and nobody
// would ever delete it (see Orphans).
func (b *backend) abandonOwner(dir, owner string) {
	sid := b.conn.SessionID()
	background.Go(func() {
		b.retryDelete(sid, func(ctx context.Context) (bool, error) {
			return false, b.deleteOwner(ctx, dir, owner)
		})
	})
}

// deleteOwner deletes every queue node of owner under dir.
func (b *backend) deleteOwner(ctx context.Context, dir, owner string) error {
	kids, err := call(ctx, b, "list", func() ([]string, error) {
		k, _, err := b.conn.Children(dir)
		return k, err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, k := range kids {
		if n, ok := parseNode(k); !ok || n.owner != owner {
			continue
		}
		_, err := call(ctx, b, "delete", func() (struct{}, error) {
			return struct{}{}, b.conn.Delete(dir+"/"+k, -1)
		})
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// retryDelete runs try until it succeeds (a nil error), the session sid
// is gone (its ephemeral nodes with it), the program closed the
// connection, or orphanRetryFor passed, pausing with a growing backoff.
// It reports try's deleted result of the successful run.
func (b *backend) retryDelete(sid int64, try func(ctx context.Context) (deleted bool, err error)) bool {
	end := time.Now().Add(orphanRetryFor)
	pause := 50 * time.Millisecond
	for time.Now().Before(end) {
		ctx, cancel := context.WithTimeout(context.Background(), dlock.DefaultReleaseTimeout)
		deleted, err := try(ctx)
		cancel()
		if err == nil {
			return deleted
		}
		if errors.Is(err, zk.ErrNoAuth) || b.conn.SessionID() != sid || b.closed() {
			return false
		}
		time.Sleep(pause)
		pause = min(2*pause, orphanBackoff)
	}
	return false
}

// closed reports whether the connection was closed by the program: its
// state stays Disconnected (a client that lost its server is Connecting
// or Connected again within a moment).
func (b *backend) closed() bool {
	for i := 0; i < 3; i++ {
		if b.conn.State() != zk.StateDisconnected {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}
