package testserver_test

import (
	"strconv"
	"testing"

	"github.com/dlock-go/dlock/internal/testserver"
)

// A server started WithTairString has the module's CAS and CAD, with
// the replies its README gives: 1 done, 0 value differs, -1 no key.
func TestStartRedis_WithTairString_CASAndCAD(t *testing.T) {
	srv := testserver.StartRedis(t, testserver.WithTairString(t))
	steps := []struct {
		args []string
		want string
	}{
		{[]string{"SET", "k", "a", "PX", "60000"}, "OK"},
		{[]string{"CAS", "k", "b", "c"}, "0"},
		{[]string{"CAS", "k", "a", "b", "PX", "30000"}, "1"},
		{[]string{"CAD", "k", "a"}, "0"},
		{[]string{"CAD", "k", "b"}, "1"},
		{[]string{"CAD", "k", "b"}, "-1"},
		{[]string{"CAS", "k", "b", "c"}, "-1"},
	}
	for _, s := range steps {
		if got, err := srv.Do(s.args...); err != nil || got != s.want {
			t.Fatalf("%v = %q, %v; want %s", s.args, got, err, s.want)
		}
	}
}

// CAS with an expiry sets the key's TTL; CAS without one leaves the key
// with no TTL at all, so a renewal or a value update by CAS must always
// give the expiry.
func TestStartRedis_WithTairString_CASWithoutExpiryDropsTTL(t *testing.T) {
	srv := testserver.StartRedis(t, testserver.WithTairString(t))
	replies, err := srv.DoSeq(
		[]string{"SET", "k", "a", "PX", "60000"},
		[]string{"CAS", "k", "a", "b", "PX", "5000"},
		[]string{"PTTL", "k"},
		[]string{"CAS", "k", "b", "c"},
		[]string{"PTTL", "k"},
	)
	if err != nil {
		t.Fatal(err)
	}
	if ttl, err := strconv.Atoi(replies[2]); err != nil || ttl <= 0 || ttl > 5000 {
		t.Fatalf("PTTL after CAS ... PX 5000 = %q", replies[2])
	}
	if replies[4] != "-1" {
		t.Fatalf("PTTL after CAS without an expiry = %q; want -1 (no TTL)", replies[4])
	}
}
