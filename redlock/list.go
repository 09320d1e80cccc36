package redlock

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/background"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// Info describes a lock held on a majority of nodes.
type Info struct {
	redisproto.Info
	// Nodes is how many nodes hold the lease.
	Nodes int `json:"nodes"`
}

// errNilContext is returned by List for a nil context, like dlock's
// Acquire does.
var errNilContext = fmt.Errorf("%w: redlock: nil context", dlock.ErrInvalidOption)

// List returns the locks whose key starts with prefix that a majority of
// nodes hold for the same owner (SCAN on every node; for operators). It
// returns by ctx's deadline even when nodes do not answer: those count as
// failed, and without a majority of answers the error wraps
// dlock.ErrUnavailable.
func (l *Locker) List(ctx context.Context, prefix string) ([]Info, error) {
	if ctx == nil { // checked before any goroutine gets it
		return nil, errNilContext
	}
	b := l.b
	if b.err != nil {
		return nil, b.err
	}
	type kv struct{ key, owner string }
	type listed struct {
		i     int
		infos []redisproto.Info
		err   error
	}
	ch := make(chan listed, len(b.nodes)) // buffered: a node answering late never blocks
	for i, n := range b.nodes {
		background.Go(func() {
			infos, err := n.List(ctx, prefix)
			ch <- listed{i, infos, err}
		})
	}
	// Every node is waited for until ctx ends (a default go-redis client
	// on a stalled link would wait for its own timeouts); a node that has
	// not answered by then counts as failed.
	agg := map[kv]*Info{}
	answered := make([]bool, len(b.nodes))
	var nerrs []error
	expired := false
	for got := 0; got < len(b.nodes) && !expired; {
		select {
		case r := <-ch:
			got++
			answered[r.i] = true
			if r.err != nil {
				nerrs = append(nerrs, fmt.Errorf("%s: %w", b.nodes[r.i].name, r.err))
				continue
			}
			for _, in := range r.infos {
				k := kv{in.Key, in.Owner}
				a := agg[k]
				if a == nil {
					a = &Info{Info: in}
					agg[k] = a
				}
				a.Nodes++
				a.Token = max(a.Token, in.Token)
				a.TTL = min(a.TTL, in.TTL)
			}
		case <-ctx.Done():
			expired = true
			for i, ok := range answered {
				if !ok {
					nerrs = append(nerrs, fmt.Errorf("%w: %s: no answer before the context ended: %w", dlock.ErrUnavailable, b.nodes[i].name, context.Cause(ctx)))
				}
			}
		}
	}
	if len(nerrs) > len(b.nodes)-b.quorum {
		return nil, fmt.Errorf("dlock: redlock list: %w", errors.Join(nerrs...))
	}
	var out []Info
	for _, a := range agg {
		if a.Nodes >= b.quorum {
			out = append(out, *a)
		}
	}
	slices.SortFunc(out, func(a, b Info) int {
		if a.Key < b.Key {
			return -1
		}
		if a.Key > b.Key {
			return 1
		}
		return 0
	})
	return out, nil
}
