package redislock

import (
	"context"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

var (
	_ dlock.Breaker  = (*Locker)(nil)
	_ driver.Breaker = (*backend)(nil)
)

// Break implements dlock.Breaker (see dlock.Break). One script removes the
// exclusive lease, every shared or limited holder (owner ""), or owner's
// lease alone, atomically: a lease granted after the break is never
// touched. A lock left free gets a release marker whose token is above
// the broken ones, and the first queued waiter is woken as by a release.
// It returns by ctx's deadline even when the server does not answer (an
// error wrapping dlock.ErrUnavailable).
func (l *Locker) Break(ctx context.Context, key, owner string) (dlock.Broken, error) {
	return l.engine().Break(ctx, key, owner)
}

// Break implements driver.Breaker.
func (b *backend) Break(ctx context.Context, key, owner string) (driver.BreakResult, error) {
	breakLock := b.node.Break
	switch tair, err := b.proto.mode(ctx); {
	case err != nil:
		return driver.BreakResult{}, requestError("break", key, err)
	case tair:
		breakLock = b.node.TairBreak
	}
	removed, others, err := breakLock(ctx, key, owner, FenceRetention)
	if tair, ferr := b.proto.fallBack(ctx, err); tair {
		removed, others, err = b.node.TairBreak(ctx, key, owner, FenceRetention)
	} else {
		err = ferr
	}
	if err != nil {
		return driver.BreakResult{}, requestError("break", key, err)
	}
	return driver.BreakResult{Removed: helds(removed, ""), Others: helds(others, "")}, nil
}

// helds converts a script's holders for the driver (node names the
// server, "" for a single deployment).
func helds(in []redisproto.Info, node string) []driver.Held {
	var out []driver.Held
	for _, h := range in {
		m := driver.Exclusive
		if h.Group != "" {
			m = driver.Mode(groupMode(h.Group))
		}
		out = append(out, driver.Held{Owner: h.Owner, Token: h.Token, Metadata: h.Metadata, TTL: h.TTL, Mode: m, Node: node})
	}
	return out
}
