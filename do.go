package dlock

import (
	"context"
	"errors"
	"fmt"
	"reflect"
)

// Do acquires key, runs fn while holding it and releases it, also when fn
// panics (the panic then goes on after the release). fn's context is
// cancelled, with the loss error as its cause, if the lock is lost while
// fn runs. The release uses its own short context if ctx is done by then.
// If the lock was lost during fn, Do returns an error wrapping ErrLockLost
// (joined with fn's error) even when fn succeeded: the work may not have
// been exclusive.
func Do(ctx context.Context, l Locker, key string, fn func(ctx context.Context, lk *Lock) error, opts ...Option) error {
	if fn == nil {
		return fmt.Errorf("%w: nil function", ErrInvalidOption)
	}
	_, err := WithLock(ctx, l, key, func(ctx context.Context, lk *Lock) (struct{}, error) {
		return struct{}{}, fn(ctx, lk)
	}, opts...)
	return err
}

// WithLock is Do for functions that return a value.
func WithLock[T any](ctx context.Context, l Locker, key string, fn func(ctx context.Context, lk *Lock) (T, error), opts ...Option) (v T, err error) {
	if l == nil || isNilPointer(l) {
		return v, ErrNilClient
	}
	if fn == nil {
		return v, fmt.Errorf("%w: nil function", ErrInvalidOption)
	}
	lk, err := l.Acquire(ctx, key, opts...)
	if err != nil {
		return v, err
	}
	fctx, cancel := lk.Context(ctx)
	defer func() {
		// Runs on return and while a panic unwinds: never leave the lock
		// held (and renewed) for the life of the process.
		cancel()
		err = errors.Join(err, lk.Release(ctx))
	}()
	return fn(fctx, lk)
}

// isNilPointer reports whether l is a typed nil pointer (a nil *X in a
// Locker interface), on which any method call would panic.
func isNilPointer(l Locker) bool {
	v := reflect.ValueOf(l)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
