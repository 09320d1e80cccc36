package redisproto

import "github.com/redis/go-redis/v9"

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
