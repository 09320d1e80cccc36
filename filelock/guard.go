package filelock

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/guard"
)

// Guard is a guard.Guard whose fences live in a directory, so processes on
// one host can share a fenced resource (a file, a local database) and
// refuse a stale lock holder whatever process it runs in.
//
// Per resource it keeps a fence file <dir>/<id>.fence holding the highest
// accepted fence as JSON {resource, token, owner}, where id is the first 32
// hex digits of the SHA-256 of the resource name, and serializes Do calls
// with an exclusive flock on <dir>/<id>.fence.flock. The flock is held
// while the fence is checked, recorded and fn runs; the fence is recorded
// durably (temp file, fsync, rename, directory fsync) before fn starts, so
// once admitted no older fence is admitted again, across restarts and
// crashes, while the directory survives.
//
// A Guard may share its directory with a Locker: their files have distinct
// suffixes.
type Guard struct {
	dir string
}

var _ guard.Guard = (*Guard)(nil)

// NewGuard returns a Guard on dir, creating it (mode 0700) if missing. The
// directory checks are New's.
func NewGuard(dir string) (*Guard, error) {
	canon, err := prepareDir(dir)
	if err != nil {
		return nil, err
	}
	return &Guard{dir: canon}, nil
}

// fenceRecord is the content of a fence file.
type fenceRecord struct {
	Resource string `json:"resource"`
	Token    uint64 `json:"token"`
	Owner    string `json:"owner"`
}

func (g *Guard) read(id, resource string) (dlock.Fence, error) {
	var fr fenceRecord
	path := filepath.Join(g.dir, id+fenceSuffix)
	ok, err := readJSON(path, &fr)
	if err != nil || !ok {
		return dlock.Fence{}, err
	}
	if fr.Resource != resource {
		return dlock.Fence{}, fmt.Errorf("%w %s: it belongs to resource %q, not %q", errCorrupt, path, fr.Resource, resource)
	}
	return dlock.Fence{Token: fr.Token, Owner: fr.Owner}, nil
}

// Do implements guard.Guard. Waiting for another Do on the same resource,
// in this process or another, is bounded by ctx. It returns a
// *dlock.StaleTokenError without running fn when f is not admitted; fn's
// error is returned as is, and the fence stays recorded even if fn fails.
func (g *Guard) Do(ctx context.Context, resource string, f dlock.Fence, fn func(ctx context.Context) error) error {
	if ctx == nil {
		return errNilContext
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	id := fileID(resource)
	fl, err := lockFile(ctx, filepath.Join(g.dir, id+fenceFlockSuffix))
	if err != nil {
		return fmt.Errorf("filelock: guard %q: %w", resource, err)
	}
	defer fl.Close()
	hi, err := g.read(id, resource)
	if err != nil {
		return fmt.Errorf("filelock: guard %q: %w", resource, err)
	}
	if !hi.Admits(f) {
		return &dlock.StaleTokenError{Resource: resource, Token: f.Token, Owner: f.Owner, Highest: hi.Token}
	}
	if hi != f {
		data, err := json.Marshal(fenceRecord{Resource: resource, Token: f.Token, Owner: f.Owner})
		if err == nil {
			err = writeAtomic(filepath.Join(g.dir, id+fenceSuffix), data, true)
		}
		if err != nil {
			return fmt.Errorf("filelock: guard %q: recording fence: %w", resource, err)
		}
	}
	return fn(ctx)
}

// Highest returns the highest fence accepted for resource (the zero Fence
// if none). It reads the fence file without waiting for a running Do: the
// file is replaced atomically, so the answer is the last recorded fence.
func (g *Guard) Highest(ctx context.Context, resource string) (dlock.Fence, error) {
	if ctx == nil {
		return dlock.Fence{}, errNilContext
	}
	if err := ctx.Err(); err != nil {
		return dlock.Fence{}, err
	}
	hi, err := g.read(fileID(resource), resource)
	if err != nil {
		return dlock.Fence{}, fmt.Errorf("filelock: guard %q: %w", resource, err)
	}
	return hi, nil
}
