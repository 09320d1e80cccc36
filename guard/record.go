package guard

import (
	"errors"
	"strconv"
	"strings"

	"github.com/dlock-go/dlock"
)

// ErrBadRecord is the error of DecodeRecord for data that EncodeRecord
// did not write.
var ErrBadRecord = errors.New("dlock: guard: not a fence record")

// EncodeRecord is a dlock.FenceRecord as text, for guards whose store
// keeps it in one value: "<token>|<owner>" for the last exclusive fence,
// with "/<seen>" after the token when a shared fence's token above it was
// admitted ("0/<seen>|" before any exclusive fence), and "" for the zero
// record. The owner comes last, so it may hold any byte.
func EncodeRecord(r dlock.FenceRecord) string {
	if r == (dlock.FenceRecord{}) {
		return ""
	}
	tok := strconv.FormatUint(r.Exclusive.Token, 10)
	if r.Seen > r.Exclusive.Token {
		tok += "/" + strconv.FormatUint(r.Seen, 10)
	}
	return tok + "|" + r.Exclusive.Owner
}

// DecodeRecord parses what EncodeRecord writes, tokens in canonical
// decimal. Anything else is an error wrapping ErrBadRecord.
func DecodeRecord(s string) (dlock.FenceRecord, error) {
	if s == "" {
		return dlock.FenceRecord{}, nil
	}
	toks, owner, ok := strings.Cut(s, "|")
	tok, seen, hasSeen := strings.Cut(toks, "/")
	t, tokOK := decimal(tok)
	if !ok || !tokOK || (t == 0 && (!hasSeen || owner != "")) {
		return dlock.FenceRecord{}, ErrBadRecord
	}
	r := dlock.FenceRecord{Seen: t}
	if t > 0 {
		r.Exclusive = dlock.Fence{Token: t, Owner: owner}
	}
	if hasSeen {
		s, ok := decimal(seen)
		if !ok || s <= t {
			return dlock.FenceRecord{}, ErrBadRecord
		}
		r.Seen = s
	}
	return r, nil
}

// decimal parses a uint64 written by strconv.FormatUint.
func decimal(s string) (uint64, bool) {
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil && strconv.FormatUint(v, 10) == s
}
