// Listing: List (dlock.Lister) reads the queue of every key under the
// Locker's prefix and reports each held key's holder and waiters.

package zklock

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"sync"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// listWorkers bounds the queues List reads at once.
const listWorkers = 16

// List implements dlock.Lister: the held locks whose key starts with
// prefix, sorted by key. Each Info has the holders' Mode (and Limit, for a
// semaphore), every Holder (owner, token, metadata and mode; the time left
// on its lease is not known to other clients: zero) and Waiters, the
// number of queue nodes behind them. Znodes under
// the Locker's prefix that EscapeKey cannot have produced are skipped.
func (l *Locker) List(ctx context.Context, prefix string) ([]dlock.Info, error) {
	return l.engine().List(ctx, prefix)
}

// ListHeld lists the keys held under prefix for the Engine's List, which
// checks the arguments, returns by ctx's deadline, fills HeldFor and sorts.
func (b *backend) ListHeld(ctx context.Context, prefix string) ([]dlock.Info, error) {
	root := b.prefix
	if root == "" {
		root = "/"
	}
	names, err := call(ctx, b, "list", func() ([]string, error) {
		k, _, err := b.conn.Children(root)
		return k, err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return []dlock.Info{}, nil
	}
	if err != nil {
		return nil, err
	}
	var keys []string
	for _, n := range names {
		if key, ok := unescapeKey(n); ok && strings.HasPrefix(key, prefix) {
			keys = append(keys, key)
		}
	}
	infos := make([]*dlock.Info, len(keys))
	errs := make([]error, len(keys))
	sem := make(chan struct{}, listWorkers)
	var wg sync.WaitGroup
	for i, key := range keys {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			infos[i], errs[i] = b.keyInfo(ctx, key)
		})
	}
	wg.Wait()
	out := make([]dlock.Info, 0, len(keys))
	for i := range keys {
		if errs[i] != nil {
			return nil, errs[i]
		}
		if infos[i] != nil {
			out = append(out, *infos[i])
		}
	}
	slices.SortFunc(out, func(a, b dlock.Info) int { return cmp.Compare(a.Key, b.Key) })
	return out, nil
}

// keyInfo reads key's queue: nil when nobody holds it.
func (b *backend) keyInfo(ctx context.Context, key string) (*dlock.Info, error) {
	dir := b.keyPath(key)
	kids, err := call(ctx, b, "list", func() ([]string, error) {
		k, _, err := b.conn.Children(dir)
		return k, err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	q := queueOf(kids)
	held := holdersOf(q)
	if len(held) == 0 {
		return nil, nil
	}
	info := &dlock.Info{Key: key, Mode: dlock.Mode(held[0].mode), Waiters: len(q) - len(held)}
	if held[0].mode == driver.Limited {
		info.Limit = held[0].limit
	}
	info.Holders = make([]dlock.Holder, len(held))
	for i, n := range held {
		info.Holders[i] = b.holderOf(ctx, key, dir, n)
	}
	return info, nil
}
