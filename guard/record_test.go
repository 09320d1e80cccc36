package guard_test

import (
	"errors"
	"math"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/guard"
)

func TestRecord_RoundTrips(t *testing.T) {
	for _, r := range []dlock.FenceRecord{
		{},
		{Exclusive: dlock.Fence{Token: 5, Owner: "a"}, Seen: 5},
		{Exclusive: dlock.Fence{Token: 5, Owner: "a|b/c"}, Seen: 7},
		{Seen: 3},
		{Exclusive: dlock.Fence{Token: math.MaxUint64, Owner: ""}, Seen: math.MaxUint64},
		{Exclusive: dlock.Fence{Token: 1}, Seen: math.MaxUint64},
	} {
		got, err := guard.DecodeRecord(guard.EncodeRecord(r))
		if err != nil || got != r {
			t.Errorf("DecodeRecord(EncodeRecord(%+v)) = %+v, %v", r, got, err)
		}
	}
	// A record without Seen reads with Seen at its token.
	if got, err := guard.DecodeRecord("5|a"); err != nil || got != (dlock.FenceRecord{Exclusive: dlock.Fence{Token: 5, Owner: "a"}, Seen: 5}) {
		t.Errorf(`DecodeRecord("5|a") = %+v, %v`, got, err)
	}
}

func TestRecord_RefusesWhatItDidNotWrite(t *testing.T) {
	for _, s := range []string{"5", "0|a", "0|", "05|a", "5/5|a", "5/4|a", "0/0|", "0/3|x", "x|a", "5/|a", "18446744073709551616|a", "-1|a", "+5|a"} {
		if r, err := guard.DecodeRecord(s); !errors.Is(err, guard.ErrBadRecord) {
			t.Errorf("DecodeRecord(%q) = %+v, %v; want ErrBadRecord", s, r, err)
		}
	}
}

func FuzzDecodeRecord(f *testing.F) {
	for _, s := range []string{"", "5|a", "5/7|a", "0/3|", "0|a", "18446744073709551615|x|y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := guard.DecodeRecord(s)
		if err != nil {
			return
		}
		if enc := guard.EncodeRecord(r); enc != s {
			t.Fatalf("DecodeRecord(%q) = %+v, which encodes as %q", s, r, enc)
		}
	})
}
