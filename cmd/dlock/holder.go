package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
)

// waitingText is --verbose's line when the first attempt did not get the
// lock: "waiting for "k", held by owner 3f2a01c2d4e5 on web-1 pid 42,
// lease ends in 4.2s", as far as that attempt saw.
func waitingText(r acquireRequest, err error) string {
	if !heldBySomeone(err) {
		return fmt.Sprintf("waiting for %q; the first attempt got no answer: %s", r.key, oneLine(err.Error()))
	}
	var na *dlock.NotAcquiredError
	h, seen := dlock.Holder{}, false
	if errors.As(err, &na) {
		h, seen = seenHolder(na)
	}
	if !seen {
		if r.mode == dlock.Shared {
			return fmt.Sprintf("waiting for %q, held, or an exclusive run is waiting for it (new shared runs wait behind it)", r.key)
		}
		return fmt.Sprintf("waiting for %q, held", r.key)
	}
	how := "held"
	switch h.Mode {
	case dlock.Shared:
		how = "held shared"
	case dlock.Limited:
		how = "held as a semaphore"
	}
	msg := fmt.Sprintf("waiting for %q, %s by %s", r.key, how, holderWords(h))
	if n := len(na.Holders); n > 1 {
		msg += fmt.Sprintf(" and %d other holder(s)", n-1)
	}
	if h.TTL > 0 {
		msg += fmt.Sprintf(", lease ends in %s", h.TTL.Round(100*time.Millisecond))
	}
	return msg
}

// holderWords names a holder in prose: "owner 3f2a01c2d4e5 on web-1 pid
// 42", control characters escaped.
func holderWords(h dlock.Holder) string {
	var parts []string
	if h.Owner != "" {
		short := h.Owner
		if len(short) > 12 {
			short = short[:12]
		}
		parts = append(parts, "owner "+oneLine(short))
	}
	if host := h.Metadata[dlock.MetaHost]; host != "" {
		parts = append(parts, "on "+oneLine(host))
	}
	if pid := h.Metadata[dlock.MetaPID]; pid != "" {
		parts = append(parts, "pid "+oneLine(pid))
	}
	if len(parts) == 0 {
		return "a holder that left no name"
	}
	return strings.Join(parts, " ")
}

// progressHolder is the progress line's note on who held the lock at the
// first attempt ("" if nobody was named).
func progressHolder(err error) string {
	var na *dlock.NotAcquiredError
	if !errors.As(err, &na) {
		return ""
	}
	if h, ok := seenHolder(na); ok && (h.Owner != "" || len(h.Metadata) > 0) {
		return " (held by " + holderWords(h) + " at the first attempt)"
	}
	return ""
}

// heldText says who holds r.key, from the holders na names: "lock "k" is
// held shared by owner 3f2a… (host=web-1 pid=42) and 2 other holder(s),
// lease ends in 4.2s". For a --limit run refused by holders of the same
// limit it says that all the permits are taken; for a --shared run
// refused by shared holders, that a writer is waiting (writer preference).
func heldText(r acquireRequest, na *dlock.NotAcquiredError) string {
	h, ok := seenHolder(na)
	if !ok {
		if r.mode == dlock.Shared {
			return fmt.Sprintf("lock %q is held, or an exclusive run is waiting for it (new shared runs wait behind it)", r.key)
		}
		return fmt.Sprintf("lock %q is held", r.key)
	}
	// allOf: every holder named (by owner or metadata) holds in mode m,
	// and there is one.
	allOf := func(m dlock.Mode) bool {
		named := 0
		for _, x := range na.Holders {
			if x.Owner != "" || len(x.Metadata) > 0 {
				if x.Mode != m {
					return false
				}
				named++
			}
		}
		return named > 0
	}
	var msg string
	switch {
	case r.mode == dlock.Limited && allOf(dlock.Limited):
		msg = fmt.Sprintf("all %d permits of lock %q are held", r.limit, r.key)
	case h.Mode == dlock.Shared:
		msg = fmt.Sprintf("lock %q is held shared", r.key)
	case h.Mode == dlock.Limited:
		msg = fmt.Sprintf("lock %q is held as a semaphore", r.key)
	default:
		msg = fmt.Sprintf("lock %q is held", r.key)
	}
	if h.Owner != "" || len(h.Metadata) > 0 {
		msg += " by " + holderText(h.Owner, h.Metadata)
	}
	if n := len(na.Holders); n > 1 {
		msg += fmt.Sprintf(" and %d other holder(s)", n-1)
	}
	if h.TTL > 0 {
		msg += fmt.Sprintf(", lease ends in %s", h.TTL.Round(time.Millisecond))
	}
	if r.mode == dlock.Shared && allOf(dlock.Shared) {
		msg += "; an exclusive run is waiting for it, and new shared runs wait behind it"
	}
	return msg
}

// heldBySomeone reports whether err says that the key is held: it wraps
// dlock.ErrNotAcquired and names an owner, metadata or a lease, or it is
// the service's own refusal (no Cause: not a wait that ended), which may
// name nobody: a shared request refused for a waiting writer once the
// readers are gone, a holder PostgreSQL's snapshot did not show.
func heldBySomeone(err error) bool {
	if !errors.Is(err, dlock.ErrNotAcquired) {
		return false
	}
	var na *dlock.NotAcquiredError
	if !errors.As(err, &na) {
		return true
	}
	_, ok := seenHolder(na)
	return ok || na.Cause == nil
}

// seenHolder returns the first holder na names that was actually seen:
// one with an owner, metadata or a lease.
func seenHolder(na *dlock.NotAcquiredError) (dlock.Holder, bool) {
	for _, h := range na.Holders {
		if h.Owner != "" || len(h.Metadata) > 0 || h.TTL > 0 {
			return h, true
		}
	}
	return dlock.Holder{}, false
}
