package driver

// Option configures a Locker when a backend's New builds it. dlock's own
// options (dlock.WithObserver) and each backend's (redislock.WithPrefix)
// are Options, so every backend's New accepts both in one list:
//
//	redislock.New(client, redislock.WithPrefix("app"), dlock.WithObserver(obs))
//
// An Option is applied to the settings it was made for and ignored by
// everything else.
type Option interface {
	apply(target any)
}

type setting[T any] func(*T)

func (f setting[T]) apply(target any) {
	if p, ok := target.(*T); ok && f != nil {
		f(p)
	}
}

// Setting returns an Option that applies f to a *T. A backend makes its
// own options with its own (unexported) settings struct as T.
func Setting[T any](f func(*T)) Option { return setting[T](f) }

// Apply applies to t every option in opts that was made for *T; nil
// options and options for other settings are skipped.
func Apply[T any](t *T, opts []Option) {
	for _, o := range opts {
		if o != nil {
			o.apply(t)
		}
	}
}
