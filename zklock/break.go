// Breaking: an operator's removal of a lock's holders (dlock.Break).

package zklock

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

var (
	_ dlock.Breaker  = (*Locker)(nil)
	_ driver.Breaker = (*backend)(nil)
)

// maxBreakRounds bounds the read-and-delete rounds of a Break whose queue
// keeps changing under it.
const maxBreakRounds = 16

// Break implements dlock.Breaker (see dlock.Break). After a sync with the
// leader (so that it sees every grant made before it), it reads the key's
// queue, picks the nodes that hold it (with an owner, that owner's node
// among them), reads each, and deletes them in one multi-op transaction
// that checks each node's version, so a node that changed meanwhile is
// never deleted: the queue is read again instead. Waiting nodes stay; the
// one watching a deleted node is woken, as by a release, and its token
// (its czxid) is above every broken one's. A forced break also removes
// the holding nodes of Curator's and go-zookeeper's lock recipes. The
// broken holders' sessions are left alone (they may carry other locks).
func (l *Locker) Break(ctx context.Context, key, owner string) (dlock.Broken, error) {
	return l.engine().Break(ctx, key, owner)
}

// Break implements driver.Breaker.
func (b *backend) Break(ctx context.Context, key, owner string) (driver.BreakResult, error) {
	dir := b.keyPath(key)
	// Catch up with the leader first: a follower may not have applied a
	// grant made through another server yet, and the break must see every
	// lock granted before it was called.
	if _, err := call(ctx, b, "break", func() (string, error) { return b.conn.Sync(dir) }); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return driver.BreakResult{}, err
	}
	for range maxBreakRounds {
		kids, err := call(ctx, b, "break", func() ([]string, error) {
			k, _, err := b.conn.Children(dir)
			return k, err
		})
		if errors.Is(err, zk.ErrNoNode) {
			return driver.BreakResult{}, nil
		}
		if err != nil {
			return driver.BreakResult{}, err
		}
		var (
			res   driver.BreakResult
			ops   []any
			raced bool
		)
		for _, n := range holdersOf(queueOf(kids)) {
			path := dir + "/" + n.name
			type got struct {
				data []byte
				stat *zk.Stat
			}
			g, err := call(ctx, b, "break", func() (got, error) {
				d, st, err := b.conn.Get(path)
				return got{d, st}, err
			})
			if errors.Is(err, zk.ErrNoNode) {
				raced = true // released meanwhile: read the queue again
				break
			}
			if err != nil {
				return driver.BreakResult{}, err
			}
			h := driver.Held{Owner: n.owner, Token: uint64(g.stat.Czxid), Mode: n.mode}
			if v := parseValue(g.data); v.Owner != "" {
				h.Owner, h.Metadata = v.Owner, v.Metadata
			}
			if h.Owner == "" {
				h.Owner = "node " + n.name
			}
			if owner != "" && h.Owner != owner {
				res.Others = append(res.Others, h)
				continue
			}
			res.Removed = append(res.Removed, h)
			ops = append(ops, &zk.DeleteRequest{Path: path, Version: g.stat.Version})
		}
		if raced {
			continue
		}
		if len(res.Removed) == 0 {
			return res, nil
		}
		res.Others = nil
		_, err = call(ctx, b, "break", func() ([]zk.MultiResponse, error) { return multi(b.conn, ops...) })
		switch {
		case err == nil:
			return res, nil
		case errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrBadVersion):
			continue // a node changed or went: read the queue again
		default:
			return driver.BreakResult{}, err
		}
	}
	return driver.BreakResult{}, fmt.Errorf("dlock: zookeeper break %q: the queue's holders kept changing; try again", key)
}
