package guard

import (
	"context"
	"fmt"
	"sync"

	"github.com/dlock-go/dlock"
)

// Memory is the reference Guard: fences kept in process memory. The zero
// value is ready to use. It suits a resource that lives in the same process
// as the guard (a service that owns the data and receives tokens from lock
// holders over its API).
type Memory struct {
	mu  sync.Mutex
	res map[string]*memRes
}

type memRes struct {
	sem chan struct{} // a token is held while the fence is checked and fn runs
	hi  dlock.Fence
}

var _ Guard = (*Memory)(nil)

func (m *Memory) resource(name string) *memRes {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.res == nil {
		m.res = map[string]*memRes{}
	}
	r := m.res[name]
	if r == nil {
		r = &memRes{sem: make(chan struct{}, 1)}
		m.res[name] = r
	}
	return r
}

// errNilContext is returned by Do for a nil context, like dlock's Acquire
// does.
var errNilContext = fmt.Errorf("%w: guard: nil context", dlock.ErrInvalidOption)

// Do implements Guard. A nil ctx is an error wrapping
// dlock.ErrInvalidOption (fn is not run, no fence is recorded).
func (m *Memory) Do(ctx context.Context, resource string, f dlock.Fence, fn func(ctx context.Context) error) error {
	if ctx == nil {
		return errNilContext
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	r := m.resource(resource)
	select {
	case r.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-r.sem }()
	if !r.hi.Admits(f) {
		return &dlock.StaleTokenError{Resource: resource, Token: f.Token, Owner: f.Owner, Highest: r.hi.Token}
	}
	r.hi = f
	return fn(ctx)
}

// Highest returns the highest fence accepted for resource.
func (m *Memory) Highest(resource string) dlock.Fence {
	r := m.resource(resource)
	r.sem <- struct{}{}
	defer func() { <-r.sem }()
	return r.hi
}
