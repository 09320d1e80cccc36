package main

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/dlock-go/dlock"
)

// lockInfo is one holder of a held key, one row of `dlock ls`: a key
// held shared or counted shows one row per holder. Mode, Limit, Holders
// and Waiters are the key's: its mode, its number of permits (limited
// keys only), how many hold it, and the clients queued for it where the
// backend keeps a queue (ZooKeeper, Redis), -1 where it cannot tell.
type lockInfo struct {
	Key      string            `json:"key"`
	Mode     string            `json:"mode"`
	Limit    int               `json:"limit,omitempty"`
	Holders  int               `json:"holders"`
	Owner    string            `json:"owner"`
	Token    uint64            `json:"token"`
	TTL      time.Duration     `json:"-"`
	TTLms    int64             `json:"ttl_ms"`
	Waiters  int               `json:"waiters"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// HeldFor is the time since the holder acquired the key, 0 where the
	// backend does not say (HeldForMs is then -1); Nodes are the redlock
	// nodes holding it for this owner (ls_nodes.go).
	HeldFor   time.Duration `json:"-"`
	HeldForMs int64         `json:"held_for_ms"`
	Nodes     []string      `json:"nodes,omitempty"`
}

// list returns the holders of the keys under prefix, one row per holder,
// sorted by key then token.
func (b *backend) list(ctx context.Context, prefix string) ([]lockInfo, error) {
	ls, ok := b.locker.(dlock.Lister)
	if !ok {
		return nil, fmt.Errorf("%w: this backend cannot list its locks", dlock.ErrUnsupported)
	}
	infos, err := ls.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	var out []lockInfo
	for _, in := range infos {
		mode := in.Mode
		for _, h := range in.Holders {
			if mode == dlock.Exclusive && h.Mode != dlock.Exclusive { // a backend that sets only the holders'
				mode = h.Mode
			}
		}
		limit := 0
		if mode == dlock.Limited {
			limit = in.Limit
		}
		for _, h := range in.Holders {
			out = append(out, lockInfo{Key: in.Key, Mode: mode.String(), Limit: limit, Holders: len(in.Holders), Owner: h.Owner, Token: h.Token, TTL: h.TTL, HeldFor: h.HeldFor, Waiters: in.Waiters, Metadata: h.Metadata})
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Key != out[j].Key {
			return out[i].Key < out[j].Key
		}
		return out[i].Token < out[j].Token
	})
	return out, nil
}
