// Package guard is the resource side of fencing: a Guard admits an
// operation on a resource only if the caller's fence (token, owner) is at
// least as new as every fence the resource accepted before, and an equal
// token only from the same owner. A holder that paused past its lease and
// comes back with an old token is refused with an error wrapping
// dlock.ErrStaleToken, even though it still believes it holds the lock.
//
// Guarantee: two operations admitted by the same guard for the same
// resource never interleave, and once a fence is admitted no older fence is
// ever admitted again (while the guard keeps its state). Reads go through
// the guard too, so a fenced read-modify-write is safe: a newer holder's
// read makes an older holder's later write fail.
//
// Not guaranteed: anything about operations that bypass the guard.
package guard

import (
	"context"

	"github.com/dlock-go/dlock"
)

// Guard runs operations on a resource under a fence check.
type Guard interface {
	// Do runs fn if f is admissible for resource, recording f as the highest
	// accepted fence, with no other Do on the same resource running at the
	// same time. It returns a *dlock.StaleTokenError (wrapping
	// dlock.ErrStaleToken) without running fn when f is stale. fn's error is
	// returned as is; the fence stays recorded even if fn fails.
	Do(ctx context.Context, resource string, f dlock.Fence, fn func(ctx context.Context) error) error
}
