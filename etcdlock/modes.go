// Modes: every queue entry records its mode (and a limited entry its
// limit); which entries of a queue hold the key, and which entries a new
// or waiting entry waits for, follow from the queue's order alone.

package etcdlock

import (
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// The values of value.Mode (an exclusive entry has none).
const (
	modeShared  = "shared"
	modeLimited = "limited"
)

// modeOf returns the mode and limit recorded in a queue entry. An entry
// that records none (an exclusive dlock entry, an etcdctl or
// concurrency.Mutex entry, anything unreadable) is exclusive, and so is a
// limited entry with a limit below 1: never more sharing than recorded.
func modeOf(kv *mvccpb.KeyValue) (driver.Mode, int) {
	if len(kv.Value) == 0 || kv.Value[0] != '{' {
		return driver.Exclusive, 0
	}
	v := parseValue(kv.Value)
	switch {
	case v.Mode == modeShared:
		return driver.Shared, 0
	case v.Mode == modeLimited && v.Limit >= 1:
		return driver.Limited, v.Limit
	}
	return driver.Exclusive, 0
}

// sameKind reports whether kv is an entry of mode m (and, for Limited, of
// limit n), that is one that may hold the key together with it.
func sameKind(kv *mvccpb.KeyValue, m driver.Mode, n int) bool {
	km, kn := modeOf(kv)
	switch m {
	case driver.Shared:
		return km == driver.Shared
	case driver.Limited:
		return km == driver.Limited && kn == n
	}
	return false
}

// holdersOf returns the entries of a queue q (sorted by create revision)
// that hold the key: the head, and behind it, if it is shared, every
// shared entry up to the first that is not, or, if it is limited to n, the
// entries limited to n up to the first that is not, n at most.
func holdersOf(q []*mvccpb.KeyValue) []*mvccpb.KeyValue {
	if len(q) == 0 {
		return nil
	}
	m, n := modeOf(q[0])
	i := 1
	switch m {
	case driver.Shared:
		for i < len(q) && sameKind(q[i], m, n) {
			i++
		}
	case driver.Limited:
		for i < len(q) && i < n && sameKind(q[i], m, n) {
			i++
		}
	}
	return q[:i:i]
}

// blockers returns the entries that an entry of mode m (limit n) queued
// behind ahead (the entries with a smaller create revision, sorted by it)
// waits for, nil when it holds the key:
//   - Exclusive: the entry just ahead (it holds when it is first).
//   - Shared: the last entry ahead that is not shared (it holds when every
//     entry ahead is shared: a reader queued behind a writer waits for
//     it).
//   - Limited(n): the last entry ahead that is not limited to n if one is
//     among the n entries just ahead, else those n entries (it holds when
//     every entry ahead is limited to n and fewer than n are ahead). The
//     n entries just ahead are the only ones whose release can let it in:
//     an entry further ahead leaving leaves n of them ahead.
//
// Deleting an entry ahead never makes an entry that holds stop holding,
// and new entries queue behind: the entries returned are the only ones
// whose deletion can change the answer.
func blockers(ahead []*mvccpb.KeyValue, m driver.Mode, n int) []*mvccpb.KeyValue {
	if len(ahead) == 0 {
		return nil
	}
	switch m {
	case driver.Shared:
		for i := len(ahead) - 1; i >= 0; i-- {
			if !sameKind(ahead[i], m, n) {
				return ahead[i : i+1 : i+1]
			}
		}
		return nil
	case driver.Limited:
		for i := len(ahead) - 1; i >= 0; i-- {
			if !sameKind(ahead[i], m, n) {
				return ahead[i : i+1 : i+1]
			}
			if len(ahead)-i == n {
				return ahead[i:len(ahead):len(ahead)]
			}
		}
		return nil
	}
	return ahead[len(ahead)-1:]
}

// limitMismatch is the error of a request for one of n permits on key
// whose holders (the head of its queue) are limited to another number,
// nil otherwise.
func limitMismatch(key string, req *driver.Request, head *mvccpb.KeyValue) error {
	if req.Mode != driver.Limited || head == nil {
		return nil
	}
	if m, n := modeOf(head); m == driver.Limited && n != req.Limit {
		return fmt.Errorf("%w: etcd key %q is held as a semaphore of %d permits, not %d", dlock.ErrLimitMismatch, key, n, req.Limit)
	}
	return nil
}

// holdersList describes the entries hs as holders.
func holdersList(hs []*mvccpb.KeyValue) []dlock.Holder {
	if len(hs) == 0 {
		return nil
	}
	out := make([]dlock.Holder, len(hs))
	for i, kv := range hs {
		out[i] = holderOf(kv)
	}
	return out
}
