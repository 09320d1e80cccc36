package dlock

// Fence is what a protected resource needs to check a lock holder: the
// fencing token, the holder's owner id, and whether the holder shares the
// key (a Shared or Limited lock).
type Fence struct {
	Token uint64
	Owner string
	// Shared is set for the fence of a Shared or Limited lock.
	Shared bool
}

// FenceRecord is what a resource keeps to apply the fencing rule: the
// last exclusive fence it admitted, and the highest token it admitted in
// any mode. The zero FenceRecord (a resource nobody used) admits every
// fence with a token above 0.
//
// The rule every guard applies (see Admit) follows from how tokens are
// handed out: every grant of a key, in any mode, takes the key's next
// token, so a holder granted after another has the higher token.
//
//   - An exclusive fence is admitted if its token is above every token
//     admitted so far (Seen), or equal to the last exclusive fence's from
//     the same non-empty owner with nothing admitted above it. It becomes
//     Exclusive and raises Seen. A writer that paused past its lease is
//     refused once anyone granted after it, in any mode, used the
//     resource: a reader or permit holder granted after the writer's
//     grant means the writer's lease had ended.
//   - A shared fence (a Shared or Limited holder) is admitted if its token
//     is at least the last exclusive fence's: it was granted after the
//     last writer that used the resource, so no writer used it since. It
//     raises Seen and leaves Exclusive alone, so shared holders valid
//     together are admitted together, in any order.
type FenceRecord struct {
	// Exclusive is the last admitted exclusive fence (Shared false), or
	// the zero Fence if none was.
	Exclusive Fence
	// Seen is the highest token admitted in any mode. A record whose Seen
	// is below Exclusive.Token is read as if Seen were Exclusive.Token.
	Seen uint64
}

// seen is r.Seen, at least r.Exclusive.Token.
func (r FenceRecord) seen() uint64 { return max(r.Seen, r.Exclusive.Token) }

// Admits reports whether a resource whose record is r admits f.
func (r FenceRecord) Admits(f Fence) bool {
	_, ok := r.Admit(f)
	return ok
}

// Admit applies the fencing rule for a resource whose record is r: it
// reports whether f is admitted and the record to keep afterwards (r
// itself when f is refused).
func (r FenceRecord) Admit(f Fence) (next FenceRecord, ok bool) {
	if f.Token == 0 {
		return r, false
	}
	seen := r.seen()
	if f.Shared {
		if f.Token < r.Exclusive.Token {
			return r, false
		}
		return FenceRecord{Exclusive: r.Exclusive, Seen: max(seen, f.Token)}, true
	}
	again := f.Token == r.Exclusive.Token && f.Owner == r.Exclusive.Owner && f.Owner != "" && seen == f.Token
	if f.Token > seen || again {
		return FenceRecord{Exclusive: Fence{Token: f.Token, Owner: f.Owner}, Seen: f.Token}, true
	}
	return r, false
}

// Bar is the token a refused f had to reach under r, as a
// *StaleTokenError reports it (Highest): the last exclusive fence's token
// for a shared fence, the highest token admitted for an exclusive one.
func (r FenceRecord) Bar(f Fence) uint64 {
	if f.Shared {
		return r.Exclusive.Token
	}
	return r.seen()
}
