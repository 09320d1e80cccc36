package redisproto

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// Exported for the tests of package redisproto_test.
var (
	LuaFiles    = luaFiles
	HelpersFile = helpersFile
)

// Scripts returns every script the package runs, by file name without
// ".lua".
func Scripts() map[string]*redis.Script { return scripts }

// Link links src with the package's helpers and constants, as the
// package's scripts are.
func Link(src string) (string, error) { return link(src, luaDefs) }

// LinkWith links src with the helpers of helpers, a helpers.lua of the
// test's own, and no constants.
func LinkWith(src, helpers string) (string, error) {
	defs, err := parseHelpers(nil, helpers)
	if err != nil {
		return "", err
	}
	return link(src, defs)
}

// ParseHelpers parses a helpers.lua of the test's own.
func ParseHelpers(src string) error {
	_, err := parseHelpers(nil, src)
	return err
}

// Suffixes are the suffixes of a lock's other keys and of its waiters'
// channels, after the lock key.
var Suffixes = []string{fenceSuffix, waitersSuffix, receiptsSuffix, channelSuffix, holdersSuffix, holderDataSuffix, writersSuffix, permitSuffix, breakSuffix}

// TakeOver sends TairAcquire's takeover of the release marker v of key
// (its token last) for hold, as a contender that read v does.
func (n *Node) TakeOver(ctx context.Context, key, v, hold string, last uint64, ttl time.Duration) (bool, error) {
	lk := n.LockKey(key)
	c, err := n.keyClient(ctx, lk)
	if err != nil {
		return false, err
	}
	now, err := n.takeOver(ctx, c, lk, v, hold, last, ttl)
	return now != nil, err
}

// SetAfterTakeOver makes hook run each time TairAcquire has taken a
// release marker over, before it writes its token (nil: none), until the
// test ends.
func SetAfterTakeOver(t interface{ Cleanup(func()) }, hook func()) {
	afterTakeOver.Store(&hook)
	t.Cleanup(func() { afterTakeOver.Store(nil) })
}
