package redislock

import (
	"context"
	"fmt"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// tryTair is Try by the Lua-free protocol (redisproto.TairAcquire):
// exclusive requests only.
func (b *backend) tryTair(ctx context.Context, req *driver.Request, meta string) (driver.Grant, error) {
	switch {
	case req.Mode != driver.Exclusive:
		return driver.Grant{}, fmt.Errorf("%w: %s locks need redislock's scripts, which the server refuses this client's user (%q; the Lua-free protocol offers exclusive locks)", dlock.ErrUnsupported, dlock.Mode(req.Mode), req.Key)
	case b.node.Acks > 0:
		return driver.Grant{}, fmt.Errorf("%w: WithReplicaAcks needs redislock's scripts, which the server refuses this client's user (%q)", dlock.ErrUnsupported, req.Key)
	}
	gen := b.breaks.gen.Load() // before the request: see breakWatch.gen
	o, err := b.node.TairAcquire(ctx, req.Key, req.Owner, req.TTL, meta)
	if err != nil {
		return driver.Grant{}, requestError("acquire", req.Key, err)
	}
	if !o.Granted {
		return driver.Grant{}, notAcquired(req, o)
	}
	v := redisproto.FormatValue(req.Owner, o.Token, meta)
	return driver.Grant{Lease: &lease{b: b, key: req.Key, owner: v, token: o.Token, tair: true, gen: gen}, Token: o.Token}, nil
}

// ownerID is the lease's owner id (see lease.owner).
func (l *lease) ownerID() string {
	if l.tair {
		return redisproto.ParseValue(l.owner).Owner
	}
	return l.owner
}
