package dlock

// Fence is what a protected resource needs to check a lock holder: the
// fencing token, the holder's owner id, and whether the holder shares the
// key (a Shared or Limited lock).
//
// The rule every guard applies (see Admit): an exclusive fence is admitted
// if its token is above the highest fence the resource accepted, or equal
// to it from the same owner, and it becomes the highest. A shared fence is
// admitted if its token is at least the highest accepted, and it is not
// recorded: shared holders overlap, so they must not fence each other out;
// what fences them is the next exclusive holder, whose token is above all
// of theirs (every grant of a key, in any mode, takes the key's next
// token). The zero Fence as the highest admits every fence with a token > 0.
type Fence struct {
	Token uint64
	Owner string
	// Shared is set for the fence of a Shared or Limited lock.
	Shared bool
}

// Admits reports whether a resource whose highest accepted fence is hi
// admits f.
func (hi Fence) Admits(f Fence) bool {
	_, ok := hi.Admit(f)
	return ok
}

// Admit applies the fencing rule for a resource whose highest accepted
// fence is hi: it reports whether f is admitted and the highest fence to
// record afterwards (f for an admitted exclusive fence, hi otherwise).
func (hi Fence) Admit(f Fence) (next Fence, ok bool) {
	if f.Token == 0 {
		return hi, false
	}
	if f.Shared {
		return hi, f.Token >= hi.Token
	}
	if f.Token > hi.Token || (f.Token == hi.Token && f.Owner == hi.Owner && f.Owner != "" && !hi.Shared) {
		return Fence{Token: f.Token, Owner: f.Owner}, true
	}
	return hi, false
}
