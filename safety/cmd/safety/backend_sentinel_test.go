package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testserver"
)

// openLocker refuses a malformed sentinel spec with an error naming it.
func TestOpenLockerBadSentinelSpec(t *testing.T) {
	for _, spec := range []string{
		"sentinel:127.0.0.1:26379",                 // no master name
		"sentinel:@127.0.0.1:26379",                // an empty one
		"sentinel:m@",                              // no sentinels
		"sentinel:m@127.0.0.1:26379?acks=0",        // acks below 1
		"sentinel:m@127.0.0.1:26379?acks=x",        // not a number
		"sentinel:m@127.0.0.1:26379?timeout=1s",    // an unknown option
		"sentinel:m@127.0.0.1:26379?acks=1&acks=2", // one option only
		"sentinel:m@a:1,,b:2",                      // an empty address
		"sentinel:m@@a:1",                          // two @
		"sentinel:m@a:1?",                          // an empty query
		"sentinel:m@a",                             // no port
	} {
		if _, _, err := openLocker(spec); err == nil || !strings.Contains(err.Error(), "sentinel") {
			t.Errorf("openLocker(%q) = %v, want an error naming the sentinel spec", spec, err)
		}
	}
}

// A worker's sentinel spec, as deploy writes it, locks through the group's
// primary, with and without acknowledgement.
func TestOpenLockerSentinel(t *testing.T) {
	s := testserver.StartSentinel(t)
	base := "sentinel:" + s.Master() + "@" + strings.Join(s.Addrs(), ",")
	for _, spec := range []string{base, base + "?acks=1"} {
		l, closeL, err := openLocker(spec)
		if err != nil {
			t.Fatalf("openLocker(%q): %v", spec, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		lk, err := l.TryAcquire(ctx, "safety/sentinel-spec", dlock.WithTTL(time.Minute))
		if err != nil {
			cancel()
			closeL()
			t.Fatalf("%s: TryAcquire: %v", spec, err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Errorf("%s: Release: %v", spec, err)
		}
		cancel()
		closeL()
	}
}
