package redlock

import (
	"testing"
	"time"
)

// Symptom: a grant the client sent again after a lost reply, which ran
// after the node had released the lease, was taken for one released
// already, and its lease stayed on the node until its TTL.
// Only a release that ran after the grant (by the node's clock), and
// released, spares the grant its own release; one not answered within the
// timeout does not.
func TestReleasedAfter_OnlyALaterReleaseCounts(t *testing.T) {
	answered := func(ok bool, at int64) *nodeRelease {
		r := &nodeRelease{done: make(chan struct{}), ok: ok, at: at}
		close(r.done)
		return r
	}
	cases := []struct {
		name string
		r    *nodeRelease
		want bool
	}{
		{"released after the grant", answered(true, 200), true},
		{"released before the grant (the grant ran again)", answered(true, 50), false},
		{"released in the same microsecond", answered(true, 100), false},
		{"not held when the release ran (the grant overtook it)", answered(false, 200), false},
		{"no answer", &nodeRelease{done: make(chan struct{})}, false},
	}
	for _, c := range cases {
		if got := releasedAfter(c.r, 100, time.Millisecond); got != c.want {
			t.Errorf("%s: releasedAfter = %v, want %v", c.name, got, c.want)
		}
	}
}
