package memlock

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
)

// List implements dlock.Lister: the held keys under prefix, sorted.
func (l *Locker) List(ctx context.Context, prefix string) ([]dlock.Info, error) {
	return l.engine().List(ctx, prefix)
}

// ListHeld lists the keys held under prefix for the Engine's List, which
// checks the arguments, returns by ctx's deadline, fills HeldFor and sorts.
func (s *state) ListHeld(ctx context.Context, prefix string) ([]dlock.Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var out []dlock.Info
	for k, ks := range s.keys {
		if !strings.HasPrefix(k, prefix) {
			continue
		}
		hs := ks.live(now)
		if len(hs) == 0 {
			continue
		}
		info := dlock.Info{Key: k, Mode: dlock.Mode(ks.mode), Limit: ks.limit, Waiters: len(s.waiters[k])}
		for _, h := range hs {
			info.Holders = append(info.Holders, h.public(ks.mode, now))
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b dlock.Info) int { return cmp.Compare(a.Key, b.Key) })
	return out, nil
}
