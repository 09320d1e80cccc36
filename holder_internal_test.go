package dlock

import (
	"strconv"
	"testing"
	"time"
)

// HeldFor comes from MetaAcquired where the service left it 0, never
// negative, and unknown (0) for junk or missing metadata.
func TestFillHeldFor(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	at := func(d time.Duration) map[string]string {
		return map[string]string{MetaAcquired: strconv.FormatInt(now.Add(-d).UnixMilli(), 10)}
	}
	infos := []Info{{Key: "k", Holders: []Holder{
		{Metadata: at(1500 * time.Millisecond)},                  // derived
		{Metadata: at(time.Hour), HeldFor: 3 * time.Second},      // the service's own kept
		{Metadata: at(-time.Minute)},                             // holder's clock ahead: 0, never negative
		{Metadata: map[string]string{MetaAcquired: "yesterday"}}, // junk: unknown
		{Metadata: map[string]string{MetaAcquired: "-5"}},        // junk: unknown
		{}, // WithoutDefaultMetadata: unknown
	}}}
	fillHeldFor(infos, now)
	want := []time.Duration{1500 * time.Millisecond, 3 * time.Second, 0, 0, 0, 0}
	for i, h := range infos[0].Holders {
		if h.HeldFor != want[i] {
			t.Errorf("holder %d: HeldFor %v, want %v", i, h.HeldFor, want[i])
		}
	}
	fillHeldFor(nil, now) // no panic
}
