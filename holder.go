package dlock

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Holder is one holder of a key, as a backend reports it to other clients
// (NotAcquiredError, Lister). Fields a backend does not know are zero.
type Holder struct {
	// Owner is the holder's random 128-bit owner id (hex).
	Owner string
	// Token is the holder's fencing token.
	Token uint64
	// Metadata is what the holder stored with the lock (host, pid, ...).
	Metadata map[string]string
	// TTL is the time left on the holder's lease.
	TTL time.Duration
	// Mode is how the holder shares the key.
	Mode Mode
	// HeldFor is how long the holder has held the key: by the service's
	// clock where it records the acquisition (pglock, memlock), else, and
	// where the service's figure is 0 (a clock that went back), since
	// Metadata[MetaAcquired], by the holder's clock against the lister's;
	// 0 when neither says.
	HeldFor time.Duration
}

// String formats the holder for messages: "owner 3f2a… (host=web-1 pid=42)".
func (h Holder) String() string { return HolderString(h.Owner, h.Metadata) }

// HolderString formats an owner id and its metadata for messages:
// "owner 3f2a… (host=web-1 pid=42)".
func HolderString(owner string, md map[string]string) string {
	var b strings.Builder
	if owner != "" {
		short := owner
		if len(short) > 12 {
			short = short[:12]
		}
		b.WriteString("owner ")
		b.WriteString(short)
	}
	if h, p := md[MetaHost], md[MetaPID]; h != "" || p != "" {
		if b.Len() > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "(host=%s pid=%s)", h, p)
	}
	if b.Len() == 0 {
		return "unknown holder"
	}
	return b.String()
}

// Info describes one held key, for dlock ls and monitoring.
type Info struct {
	Key string
	// Mode is the holders' mode; Limit the permit count for Limited keys.
	Mode  Mode
	Limit int
	// Holders lists the holders: one for an exclusive lock.
	Holders []Holder
	// Waiters is the number of queued waiters, where the backend keeps a
	// queue (-1 when it cannot tell).
	Waiters int
}

// Lister is implemented by every backend's Locker that can list the keys
// held under a prefix ("" for all). Use it through a type assertion:
//
//	if ls, ok := locker.(dlock.Lister); ok { infos, err := ls.List(ctx, "jobs/") }
//
// Infos come sorted by key. An Engine is a Lister whatever its driver; over
// a driver that cannot list, List returns an error wrapping ErrUnsupported.
type Lister interface {
	List(ctx context.Context, prefix string) ([]Info, error)
}

// heldLister is the driver side of List: a driver.Driver with this method
// gives its Engine, and so its backend's Locker, a List. ListHeld returns
// the keys held under prefix, as the service reports them; the Engine
// checks the arguments first, returns by ctx's deadline whatever the
// driver does, fills HeldFor from MetaAcquired where the service left it
// 0, and sorts the result by key.
type heldLister interface {
	ListHeld(ctx context.Context, prefix string) ([]Info, error)
}

// List implements Lister over a driver that lists held keys (ListHeld;
// every dlock backend's does): the keys held under prefix ("" for all),
// sorted by key. It returns by ctx's deadline even when the service does
// not answer; a list cut off by the context's end, whether the Engine or
// the driver's client gave up first, and a list asked with a context that
// had already ended, fail with an error wrapping ErrUnavailable and the
// context's error. A driver that cannot list gives an error wrapping
// ErrUnsupported.
func (e *Engine) List(ctx context.Context, prefix string) ([]Info, error) {
	if err := e.check(ctx); err != nil {
		return nil, err
	}
	if e.lister == nil {
		return nil, fmt.Errorf("%w: %s cannot list held keys", ErrUnsupported, e.spec.Name)
	}
	infos, err, abandoned := call(ctx, func(ctx context.Context) ([]Info, error) { return e.lister.ListHeld(ctx, prefix) }, nil)
	switch {
	case abandoned || ctx.Err() != nil && isContextErr(err, ctx):
		return nil, fmt.Errorf("%w: %s list: no answer before the context ended: %w", ErrUnavailable, e.spec.Name, err)
	case err != nil:
		return nil, err
	}
	fillHeldFor(infos, time.Now())
	slices.SortStableFunc(infos, func(a, b Info) int { return strings.Compare(a.Key, b.Key) })
	return infos, nil
}

// fillHeldFor sets, for each holder in infos whose HeldFor is 0, HeldFor
// to the time from its Metadata[MetaAcquired] to now (never negative: the
// holder's clock may run ahead of now's); a holder without that metadata,
// or with a value that is not Unix milliseconds, keeps 0.
func fillHeldFor(infos []Info, now time.Time) {
	for i := range infos {
		for j := range infos[i].Holders {
			h := &infos[i].Holders[j]
			if h.HeldFor != 0 {
				continue
			}
			ms, err := strconv.ParseInt(h.Metadata[MetaAcquired], 10, 64)
			if err != nil || ms <= 0 {
				continue
			}
			h.HeldFor = max(now.Sub(time.UnixMilli(ms)), 0)
		}
	}
}
