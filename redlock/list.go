package redlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/background"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// List implements dlock.Lister: the locks whose key starts with prefix
// that a majority of nodes hold for the same owner (SCAN on every node;
// for operators), sorted by key. Each has one holder, with the highest
// token and the shortest lease left among the nodes holding it; Waiters is
// -1 (the nodes' queues are not read). It returns by ctx's deadline even
// when nodes do not answer: those count as failed, and without a majority
// of answers the error wraps dlock.ErrUnavailable.
func (l *Locker) List(ctx context.Context, prefix string) ([]dlock.Info, error) {
	return l.engine().List(ctx, prefix)
}

// ListHeld lists the keys held under prefix for the Engine's List, which
// checks the arguments, returns by ctx's deadline, fills HeldFor and sorts.
func (b *backend) ListHeld(ctx context.Context, prefix string) ([]dlock.Info, error) {
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
	type held struct {
		h     dlock.Holder
		nodes int
	}
	agg := map[kv]*held{}
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
					a = &held{h: dlock.Holder{Owner: in.Owner, Token: in.Token, Metadata: in.Metadata, TTL: in.TTL, Mode: dlock.Exclusive}}
					agg[k] = a
				}
				a.nodes++
				a.h.Token = max(a.h.Token, in.Token)
				a.h.TTL = min(a.h.TTL, in.TTL)
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
	var out []dlock.Info
	for k, a := range agg {
		if a.nodes >= b.quorum {
			out = append(out, dlock.Info{Key: k.key, Mode: dlock.Exclusive, Holders: []dlock.Holder{a.h}, Waiters: -1})
		}
	}
	slices.SortFunc(out, func(x, y dlock.Info) int { return strings.Compare(x.Key, y.Key) })
	return out, nil
}
