package redisproto

import (
	"slices"
	"testing"
)

// withSuffixes builds the keys a script's KEYS list names: lk, then lk
// with each suffix, whatever their lengths.
func TestWithSuffixes_LockKeyThenEachSuffix(t *testing.T) {
	for _, tc := range []struct {
		lk   string
		sfx  []string
		want []string
	}{
		{"p:{k}", nil, []string{"p:{k}"}},
		{"p:{k}", []string{":waiters", ":rel"}, []string{"p:{k}", "p:{k}:waiters", "p:{k}:rel"}},
		{"", []string{"", ":x"}, []string{"", "", ":x"}},
	} {
		if got := withSuffixes(tc.lk, tc.sfx...); !slices.Equal(got, tc.want) {
			t.Errorf("withSuffixes(%q, %q) = %q, want %q", tc.lk, tc.sfx, got, tc.want)
		}
	}
}
