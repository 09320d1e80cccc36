package driver

import (
	"path"
	"reflect"
)

// Option configures a Locker when a backend's New builds it. dlock's own
// options (dlock.WithObserver) and each backend's (redislock.WithPrefix)
// are Options, so every backend's New accepts both in one list:
//
//	redislock.New(client, redislock.WithPrefix("app"), dlock.WithObserver(obs))
//
// An Option is applied to the settings it was made for and skipped by
// everything else; a backend's New refuses an option of another backend
// (Foreign), so that etcdlock.New(c, zklock.WithPrefix("/app")) fails
// instead of dropping the prefix.
type Option interface {
	apply(target any)
	// pkg is the import path of the package whose settings the option
	// sets, "" for a core option that every backend accepts.
	pkg() string
}

type setting[T any] func(*T)

func (f setting[T]) apply(target any) {
	if p, ok := target.(*T); ok && f != nil {
		f(p)
	}
}

func (setting[T]) pkg() string { return reflect.TypeFor[T]().PkgPath() }

type coreSetting[T any] struct{ setting[T] }

func (coreSetting[T]) pkg() string { return "" }

// Setting returns an Option that applies f to a *T. A backend makes its
// own options with its own (unexported) settings struct as T; the option
// belongs to T's package.
func Setting[T any](f func(*T)) Option { return setting[T](f) }

// CoreSetting is Setting for an option that every backend accepts
// (dlock.WithObserver): Foreign never reports it.
func CoreSetting[T any](f func(*T)) Option { return coreSetting[T]{setting[T](f)} }

// Apply applies to t every option in opts that was made for *T; nil
// options and options for other settings are skipped.
func Apply[T any](t *T, opts []Option) {
	for _, o := range opts {
		if o != nil {
			o.apply(t)
		}
	}
}

// Foreign returns the first option in opts made for another package's
// settings than T's (nil options and core options never are), and that
// package's name ("zklock"); nil and "" when every option is T's
// package's or a core one. A backend's New calls it with its own
// settings type and fails on a foreign option.
func Foreign[T any](opts []Option) (Option, string) {
	return ForeignTo(opts, reflect.TypeFor[T]().PkgPath())
}

// ForeignTo is Foreign for the package whose import path is own.
func ForeignTo(opts []Option, own string) (Option, string) {
	for _, o := range opts {
		if o == nil {
			continue
		}
		if p := o.pkg(); p != "" && p != own {
			return o, path.Base(p)
		}
	}
	return nil, ""
}
