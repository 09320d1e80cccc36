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
	return driver.Grant{Lease: &lease{b: b, key: req.Key, owner: req.Owner, token: o.Token, tair: true, meta: meta, gen: gen}, Token: o.Token}, nil
}

// value is a Lua-free lease's value on the server: the one its CAS and CAD
// compare with.
func (l *lease) value() string { return redisproto.FormatValue(l.owner, l.token, l.meta) }
