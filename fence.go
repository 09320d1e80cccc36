package dlock

// Fence is what a protected resource needs to check a lock holder: the
// fencing token and the holder's owner id. Guards admit a fence if its token
// is above the highest they accepted, or equal to it from the same owner.
type Fence struct {
	Token uint64
	Owner string
}

// Admits reports whether a resource whose highest accepted fence is hi
// admits f. The zero Fence as hi admits everything with a token > 0.
func (hi Fence) Admits(f Fence) bool {
	return f.Token > hi.Token || (f.Token == hi.Token && f.Owner == hi.Owner && f.Owner != "")
}
