package filelock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/guard"
)

// Guard is a guard.Guard and guard.Doer whose fences and values live in a
// directory, so processes on one host can share a fenced resource (a
// file, a local database, or the values kept by Put) and refuse a stale
// lock holder whatever process it runs in. It applies the rule of package
// guard through guard.Checker.
//
// Per resource it keeps a fence file, a flock file held while the fence is
// checked and recorded and the operation runs, and a data file per name
// Put (docs/filelock.md, Guard files). Fences and values are written
// atomically and durably: the new fence before the operation starts, a
// Put's value before it returns, so once admitted no older fence is
// admitted again, across restarts and crashes, while the directory
// survives. A file that cannot be decoded, or that names another resource
// or name, fails the operation with an error naming the file rather than
// restarting the resource's fences; delete it to reset.
//
// Waiting for another operation on the same resource, in this process or
// another, is bounded by the context. Highest reads the fence file without
// waiting: it is replaced atomically, so the answer is the last recorded
// fence. A Guard may share its directory with a Locker: their files have
// distinct suffixes.
type Guard struct {
	dir string
	chk guard.Checker
}

var (
	_ guard.Guard = (*Guard)(nil)
	_ guard.Doer  = (*Guard)(nil)
)

// File name suffix of a guard's values.
const dataSuffix = ".data"

// NewGuard returns a Guard on dir, creating it (mode 0700) if missing. It
// fails, like New, with an error wrapping dlock.ErrInvalidOption when dir
// is empty, exists but is not a directory, or is not writable. It accepts
// dlock.WithObserver (refusals are reported with Backend "file"); the
// Locker's options (WithPollInterval, WithInotify) are ignored.
func NewGuard(dir string, opts ...Option) (*Guard, error) {
	canon, err := prepareDir(dir)
	if err != nil {
		return nil, err
	}
	return &Guard{dir: canon, chk: guard.NewChecker("file", opts)}, nil
}

// Dir returns the guard's directory (absolute, symlinks resolved).
func (g *Guard) Dir() string { return g.dir }

// fenceRecord is the content of a fence file.
type fenceRecord struct {
	Resource string `json:"resource"`
	Token    uint64 `json:"token"`
	Owner    string `json:"owner"`
	// Seen is the highest token admitted in any mode, when above Token.
	Seen uint64 `json:"seen,omitempty"`
}

// dataRecord is the content of a data file.
type dataRecord struct {
	Resource string `json:"resource"`
	Name     string `json:"name"`
	Value    []byte `json:"value"`
}

func (g *Guard) fencePath(resource string) string {
	return filepath.Join(g.dir, fileID(resource)+fenceSuffix)
}

func (g *Guard) dataPath(resource, name string) string {
	return filepath.Join(g.dir, fileID(resource+"\x00"+name)+dataSuffix)
}

func (g *Guard) read(resource string) (dlock.FenceRecord, error) {
	var fr fenceRecord
	path := g.fencePath(resource)
	ok, err := readJSON(path, &fr)
	if err != nil || !ok {
		return dlock.FenceRecord{}, err
	}
	if fr.Resource != resource {
		return dlock.FenceRecord{}, fmt.Errorf("%w %s: it belongs to resource %q, not %q", errCorrupt, path, fr.Resource, resource)
	}
	return dlock.FenceRecord{Exclusive: dlock.Fence{Token: fr.Token, Owner: fr.Owner}, Seen: fr.Seen}, nil
}

// run checks f for resource under the resource's flock and, if it is
// admitted, records it durably and runs op, still under the flock. A
// refusal is returned as is (a *dlock.StaleTokenError), other errors
// wrapped with the resource.
func (g *Guard) run(ctx context.Context, resource string, f dlock.Fence, op func() error) error {
	if err := g.chk.ValidateFence(f); err != nil {
		return err
	}
	fl, err := lockFile(ctx, filepath.Join(g.dir, fileID(resource)+fenceFlockSuffix))
	if err != nil {
		return fmt.Errorf("filelock: guard %q: %w", resource, err)
	}
	defer fl.Close()
	rec, err := g.read(resource)
	if err != nil {
		return fmt.Errorf("filelock: guard %q: %w", resource, err)
	}
	next, err := g.chk.Check(resource, rec, f)
	if err != nil {
		return err
	}
	if next != rec {
		fr := fenceRecord{Resource: resource, Token: next.Exclusive.Token, Owner: next.Exclusive.Owner}
		if next.Seen > next.Exclusive.Token {
			fr.Seen = next.Seen
		}
		data, err := json.Marshal(fr)
		if err == nil {
			err = writeAtomic(g.fencePath(resource), data, true)
		}
		if err != nil {
			return fmt.Errorf("filelock: guard %q: recording fence: %w", resource, err)
		}
	}
	return op()
}

// Do implements guard.Doer. fn runs with the resource's flock held, after
// its fence was recorded durably.
func (g *Guard) Do(ctx context.Context, resource string, f dlock.Fence, fn func(ctx context.Context) error) error {
	if err := g.chk.Validate(ctx, resource); err != nil {
		return err
	}
	if fn == nil {
		return fmt.Errorf("%w: filelock: guard: nil function", dlock.ErrInvalidOption)
	}
	return g.run(ctx, resource, f, func() error { return fn(ctx) })
}

// Put implements guard.Guard. The value is durable when Put returns nil.
func (g *Guard) Put(ctx context.Context, resource string, f dlock.Fence, name, value string) error {
	if err := g.chk.Validate(ctx, resource, name); err != nil {
		return err
	}
	return g.run(ctx, resource, f, func() error {
		data, err := json.Marshal(dataRecord{Resource: resource, Name: name, Value: []byte(value)})
		if err == nil {
			err = writeAtomic(g.dataPath(resource, name), data, true)
		}
		if err != nil {
			return fmt.Errorf("filelock: guard %q: writing %q: %w", resource, name, err)
		}
		return nil
	})
}

// Get implements guard.Guard.
func (g *Guard) Get(ctx context.Context, resource string, f dlock.Fence, name string) (value string, ok bool, err error) {
	if err := g.chk.Validate(ctx, resource, name); err != nil {
		return "", false, err
	}
	err = g.run(ctx, resource, f, func() error {
		var dr dataRecord
		path := g.dataPath(resource, name)
		b, err := os.ReadFile(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil
		case err != nil:
		case json.Unmarshal(b, &dr) != nil || dr.Resource != resource || dr.Name != name:
			err = fmt.Errorf("%w %s: not the value of this resource and name (remove it to reset the name)", errCorrupt, path)
		}
		if err != nil {
			return fmt.Errorf("filelock: guard %q: reading %q: %w", resource, name, err)
		}
		value, ok = string(dr.Value), true
		return nil
	})
	if err != nil {
		return "", false, err
	}
	return value, ok, nil
}

// Highest implements guard.Guard. It does not wait for a running
// operation on the resource.
func (g *Guard) Highest(ctx context.Context, resource string) (dlock.Fence, error) {
	if err := g.chk.Validate(ctx, resource); err != nil {
		return dlock.Fence{}, err
	}
	rec, err := g.read(resource)
	if err != nil {
		return dlock.Fence{}, fmt.Errorf("filelock: guard %q: %w", resource, err)
	}
	return rec.Exclusive, nil
}
