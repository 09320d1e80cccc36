package dlock_test

import (
	"testing"

	"github.com/dlock-go/dlock"
)

func TestFenceRecord_Admit(t *testing.T) {
	a5 := dlock.Fence{Token: 5, Owner: "a"}
	rec := dlock.FenceRecord{Exclusive: a5, Seen: 5}
	for _, c := range []struct {
		f    dlock.Fence
		want bool
	}{
		{dlock.Fence{Token: 6, Owner: "b"}, true},
		{dlock.Fence{Token: 5, Owner: "a"}, true},
		{dlock.Fence{Token: 5, Owner: "b"}, false},
		{dlock.Fence{Token: 4, Owner: "a"}, false},
		{dlock.Fence{Token: 5, Owner: "s", Shared: true}, true},
		{dlock.Fence{Token: 4, Owner: "s", Shared: true}, false},
		{dlock.Fence{Token: 0, Owner: "s", Shared: true}, false},
	} {
		if got := rec.Admits(c.f); got != c.want {
			t.Errorf("%+v admits %+v = %v", rec, c.f, got)
		}
	}
	if (dlock.FenceRecord{}).Admits(dlock.Fence{}) {
		t.Error("zero fence admitted by an unused resource")
	}
	// A record written before Seen was kept reads as Seen = Exclusive.Token.
	if !(dlock.FenceRecord{Exclusive: a5}).Admits(a5) {
		t.Error("the exclusive holder again refused by a record without Seen")
	}
}

// A writer that paused past its lease was admitted after a reader or
// permit holder granted later had used the resource.
func TestFenceRecord_RefusesWriterBelowSharedToken(t *testing.T) {
	w := dlock.Fence{Token: 5, Owner: "w"}
	rec, ok := dlock.FenceRecord{}.Admit(w)
	if !ok {
		t.Fatal("writer refused on an unused resource")
	}
	rec, ok = rec.Admit(dlock.Fence{Token: 6, Owner: "r", Shared: true})
	if !ok || rec.Seen != 6 || rec.Exclusive != w {
		t.Fatalf("newer reader: admitted %v, record %+v; want admitted, Seen 6, the writer still the exclusive fence", ok, rec)
	}
	if _, ok := rec.Admit(w); ok {
		t.Fatal("the paused writer was admitted after a newer reader used the resource")
	}
	if got := rec.Bar(w); got != 6 {
		t.Fatalf("Bar(writer) = %d, want 6", got)
	}
}

// The rule, checked on every sequence of up to five fences over tokens
// 1..3, owners a and b and both modes, against its statement: an
// exclusive fence is admitted iff its token is above every token admitted
// before, or it repeats the last admitted exclusive fence with nothing
// admitted above it; a shared fence iff its token is at least the last
// admitted exclusive fence's.
func TestFenceRecord_AdmitMatchesRule(t *testing.T) {
	var fences []dlock.Fence
	for tok := uint64(0); tok <= 3; tok++ {
		for _, o := range []string{"a", "b", ""} {
			fences = append(fences, dlock.Fence{Token: tok, Owner: o}, dlock.Fence{Token: tok, Owner: o, Shared: true})
		}
	}
	var walk func(rec dlock.FenceRecord, admitted []dlock.Fence, depth int)
	walk = func(rec dlock.FenceRecord, admitted []dlock.Fence, depth int) {
		if depth == 5 || t.Failed() {
			return
		}
		for _, f := range fences {
			var maxTok uint64
			var lastX dlock.Fence
			for _, p := range admitted {
				maxTok = max(maxTok, p.Token)
				if !p.Shared {
					lastX = p
				}
			}
			want := f.Token > 0
			if want && f.Shared {
				want = f.Token >= lastX.Token
			} else if want {
				want = f.Token > maxTok || (f == lastX && f.Owner != "" && maxTok == f.Token)
			}
			next, ok := rec.Admit(f)
			if ok != want {
				t.Fatalf("after %+v, %+v admitted = %v, want %v", admitted, f, ok, want)
			}
			if ok {
				walk(next, append(admitted[:len(admitted):len(admitted)], f), depth+1)
			} else if next != rec {
				t.Fatalf("after %+v, refused %+v changed the record %+v to %+v", admitted, f, rec, next)
			}
		}
	}
	walk(dlock.FenceRecord{}, nil, 0)
}
