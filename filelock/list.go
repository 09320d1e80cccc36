package filelock

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
)

// List returns the keys with unexpired leases whose key starts with prefix,
// sorted by key, each with its mode, its limit (for a semaphore) and every
// unexpired holder, oldest token first. Waiters is -1: filelock keeps no
// queue. It reads the records without taking their flocks: each record is
// replaced atomically, so every entry is a consistent snapshot. Records that
// cannot be decoded are skipped.
func (l *Locker) List(ctx context.Context, prefix string) ([]dlock.Info, error) {
	return l.engine().List(ctx, prefix)
}

// ListHeld lists the keys held under prefix for the Engine's List, which
// checks the arguments, returns by ctx's deadline, fills HeldFor and sorts.
func (b *backend) ListHeld(ctx context.Context, prefix string) ([]dlock.Info, error) {
	ents, err := os.ReadDir(b.dir)
	if err != nil {
		return nil, fmt.Errorf("filelock: list: %w", err)
	}
	out := []dlock.Info{}
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !strings.HasSuffix(e.Name(), leaseSuffix) || !e.Type().IsRegular() {
			continue
		}
		var r record
		if ok, err := readJSON(filepath.Join(b.dir, e.Name()), &r); !ok || err != nil {
			continue
		}
		if !strings.HasPrefix(r.Key, prefix) || fileID(r.Key)+leaseSuffix != e.Name() {
			continue
		}
		now := time.Now().UnixNano()
		s := r.state(now)
		if len(s.holders) == 0 {
			continue
		}
		info := dlock.Info{Key: r.Key, Mode: dlock.Mode(s.mode), Limit: s.limit, Holders: s.public(now), Waiters: -1}
		if s.foreign {
			info.Holders = s.refusal(r.Key, now, false).Holders
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b dlock.Info) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}
