package dlock

import (
	"context"
	"errors"
)

// Do acquires key, runs fn while holding it and releases it. fn's context
// is cancelled, with the loss error as its cause, if the lock is lost while
// fn runs. The release uses its own short context if ctx is done by then.
// If the lock was lost during fn, Do returns an error wrapping ErrLockLost
// (joined with fn's error) even when fn succeeded: the work may not have
// been exclusive.
func Do(ctx context.Context, l Locker, key string, fn func(ctx context.Context, lk *Lock) error, opts ...Option) error {
	_, err := WithLock(ctx, l, key, func(ctx context.Context, lk *Lock) (struct{}, error) {
		return struct{}{}, fn(ctx, lk)
	}, opts...)
	return err
}

// WithLock is Do for functions that return a value.
func WithLock[T any](ctx context.Context, l Locker, key string, fn func(ctx context.Context, lk *Lock) (T, error), opts ...Option) (T, error) {
	var zero T
	if l == nil {
		return zero, ErrNilClient
	}
	lk, err := l.Acquire(ctx, key, opts...)
	if err != nil {
		return zero, err
	}
	fctx, cancel := lk.Context(ctx)
	v, ferr := fn(fctx, lk)
	cancel()
	return v, errors.Join(ferr, lk.Release(ctx))
}
