package redislock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// List implements dlock.Lister: the locks currently held whose key starts
// with prefix, sorted by key, each with its mode, its holders (owner,
// token, metadata, time left on the lease, mode: one for an exclusive
// lock, every live reader or permit holder otherwise), a semaphore's limit
// and the number of waiters in its queue. It scans the keyspace (SCAN, on every master of a Cluster), then
// reads the queues' sizes in one pipeline: it is meant for operators
// (dlock ls), not for hot paths. A queue may still count, for up to a
// minute, a waiter that left while its link failed. List returns by ctx's
// deadline even when the server does not answer (an error wrapping
// dlock.ErrUnavailable).
func (l *Locker) List(ctx context.Context, prefix string) ([]dlock.Info, error) {
	return l.engine().List(ctx, prefix)
}

// ListHeld lists the keys held under prefix for the Engine's List, which
// checks the arguments, returns by ctx's deadline, fills HeldFor and sorts.
func (b *backend) ListHeld(ctx context.Context, prefix string) ([]dlock.Info, error) {
	infos, err, abandoned := redisproto.Await(ctx, func(ctx context.Context) ([]dlock.Info, error) {
		return b.list(ctx, prefix)
	})
	switch {
	case abandoned || clientGaveUp(ctx, err):
		return nil, fmt.Errorf("%w: redis list: no answer before the context ended: %w", dlock.ErrUnavailable, withCause(ctx, err))
	case err != nil:
		return nil, fmt.Errorf("dlock: redis list: %w", err)
	}
	return infos, nil
}

// clientGaveUp says whether err is the client giving up at ctx's end by
// itself, a moment before Await would have abandoned the call: go-redis
// returns the context's error from its dial loop (a failover client whose
// Sentinels refuse connections), or a read timeout at the deadline with
// ContextTimeoutEnabled. The outcome is the same as an abandoned call: no
// answer before the context ended.
func clientGaveUp(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() == nil {
		return false
	}
	var te interface{ Timeout() bool }
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.As(err, &te) && te.Timeout()
}

// withCause is err with ctx's cause joined, unless err is that already.
func withCause(ctx context.Context, err error) error {
	cause := context.Cause(ctx)
	if cause == nil || errors.Is(err, cause) {
		return err
	}
	return errors.Join(err, cause)
}

func (b *backend) list(ctx context.Context, prefix string) ([]dlock.Info, error) {
	held, err := b.node.List(ctx, prefix)
	if err != nil || len(held) == 0 {
		return nil, err
	}
	slices.SortFunc(held, func(a, b redisproto.Info) int { return cmp.Compare(a.Key, b.Key) })
	cards := make([]*redis.IntCmd, len(held))
	if _, err := b.node.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, in := range held {
			cards[i] = p.ZCard(ctx, b.node.WaitersKey(in.Key))
		}
		return nil
	}); err != nil {
		return nil, err
	}
	out := make([]dlock.Info, len(held))
	for i, in := range held {
		out[i] = dlock.Info{Key: in.Key, Mode: dlock.Exclusive, Waiters: int(cards[i].Val())}
		if in.Group != "" {
			m := groupMode(in.Group)
			out[i].Mode, out[i].Limit = m, in.Limit
			for _, h := range in.Holders {
				out[i].Holders = append(out[i].Holders, dlock.Holder{
					Owner: h.Owner, Token: h.Token, Metadata: h.Metadata, TTL: h.TTL, Mode: m,
				})
			}
			continue
		}
		out[i].Holders = []dlock.Holder{{
			Owner:    in.Owner,
			Token:    in.Token,
			Metadata: in.Metadata,
			TTL:      in.TTL,
			Mode:     dlock.Exclusive,
		}}
	}
	return out, nil
}
