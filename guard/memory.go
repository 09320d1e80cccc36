package guard

import (
	"context"
	"fmt"
	"sync"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// Memory is the reference guard: fences and values kept in process
// memory. It suits a resource that lives in the same process as the guard
// (a service that owns the data and receives fences from lock holders
// over its API). Its state lasts as long as the Memory: a new Memory (a
// restarted process) admits any fence again.
//
// The zero value is ready to use, without an Observer; NewMemory takes
// options. A Memory must not be copied after first use. Memory keeps one
// small entry per resource it has seen, for as long as it lives.
type Memory struct {
	chk Checker
	mu  sync.Mutex
	res map[string]*memRes
}

type memRes struct {
	// sem is held while an operation checks the fence and runs: Do, Put
	// and Get on one resource never overlap.
	sem chan struct{}
	// mu guards rec and data; they change only while sem is held, and
	// Highest reads rec without waiting for a running Do.
	mu   sync.Mutex
	rec  dlock.FenceRecord
	data map[string]string
}

var (
	_ Guard = (*Memory)(nil)
	_ Doer  = (*Memory)(nil)
)

// NewMemory returns an empty Memory. It accepts dlock.WithObserver (its
// refusals are reported with Backend "memory"); other options are ignored.
func NewMemory(opts ...driver.Option) *Memory {
	return &Memory{chk: NewChecker("memory", opts)}
}

func (m *Memory) checker() Checker {
	if m.chk.backend == "" {
		return Checker{backend: "memory"}
	}
	return m.chk
}

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

// run checks f for resource and, if it is admitted, records it and runs
// op, all while holding the resource's sem.
func (m *Memory) run(ctx context.Context, resource string, f dlock.Fence, op func(r *memRes) error) error {
	r := m.resource(resource)
	select {
	case r.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-r.sem }()
	r.mu.Lock()
	next, err := m.checker().Check(resource, r.rec, f)
	r.rec = next
	r.mu.Unlock()
	if err != nil {
		return err
	}
	return op(r)
}

// Do implements Doer.
func (m *Memory) Do(ctx context.Context, resource string, f dlock.Fence, fn func(ctx context.Context) error) error {
	c := m.checker()
	if err := c.Validate(ctx, resource); err != nil {
		return err
	}
	if err := c.ValidateFence(f); err != nil {
		return err
	}
	if fn == nil {
		return fmt.Errorf("%w: %s guard: nil function", dlock.ErrInvalidOption, c.backend)
	}
	return m.run(ctx, resource, f, func(*memRes) error { return fn(ctx) })
}

// Put implements Guard. Waiting for a running Do on the resource is
// bounded by ctx.
func (m *Memory) Put(ctx context.Context, resource string, f dlock.Fence, name, value string) error {
	if err := m.checker().Validate(ctx, resource, name); err != nil {
		return err
	}
	if err := m.checker().ValidateFence(f); err != nil {
		return err
	}
	return m.run(ctx, resource, f, func(r *memRes) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.data == nil {
			r.data = map[string]string{}
		}
		r.data[name] = value
		return nil
	})
}

// Get implements Guard. Waiting for a running Do on the resource is
// bounded by ctx.
func (m *Memory) Get(ctx context.Context, resource string, f dlock.Fence, name string) (value string, ok bool, err error) {
	if err := m.checker().Validate(ctx, resource, name); err != nil {
		return "", false, err
	}
	if err := m.checker().ValidateFence(f); err != nil {
		return "", false, err
	}
	err = m.run(ctx, resource, f, func(r *memRes) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		value, ok = r.data[name]
		return nil
	})
	return value, ok, err
}

// Highest implements Guard. It does not wait for a running Do: the fence
// is recorded before fn starts.
func (m *Memory) Highest(ctx context.Context, resource string) (dlock.Fence, error) {
	if err := m.checker().Validate(ctx, resource); err != nil {
		return dlock.Fence{}, err
	}
	m.mu.Lock()
	r := m.res[resource]
	m.mu.Unlock()
	if r == nil {
		return dlock.Fence{}, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rec.Exclusive, nil
}
