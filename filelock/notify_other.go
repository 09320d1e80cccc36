//go:build !linux

package filelock

import "errors"

// dirNotifier is Linux-only; elsewhere waiters poll.
type dirNotifier struct{}

func startNotifier(string, func(string), func()) (*dirNotifier, error) {
	return nil, errors.ErrUnsupported
}

func (*dirNotifier) close() {}
