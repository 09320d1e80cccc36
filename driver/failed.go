package driver

import "context"

// Failed returns a Driver that stands for a backend its New could not
// build (a nil client, a bad option): dlock.NewEngine given it returns an
// Engine whose every call fails with err (dlock.ErrNilClient when err is
// nil), so that a New without an error result reports the failure at the
// first call, the same way for every backend.
func Failed(err error) Driver { return failed{err} }

type failed struct{ err error }

func (f failed) Spec() Spec                                   { return Spec{Name: "failed"} }
func (f failed) Try(context.Context, *Request) (Grant, error) { return Grant{}, f.err }

// FailureOf reports whether d was made by Failed, and with which error.
func FailureOf(d Driver) (bool, error) {
	f, ok := d.(failed)
	return ok, f.err
}
