package filelock

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// keyState is a key as the lock logic sees it at one wall-clock instant:
// the live holders of its record, all of one mode, and the live waiting
// writers of its writers file (when loaded: see withWriters). Expired
// entries are dropped when the state is read, and so disappear from the
// files at their next write.
type keyState struct {
	mode  driver.Mode
	limit int // for Limited
	// foreign marks a record this version does not understand (a mode it
	// does not know, written by a newer version, or an inconsistent one):
	// it is treated as held by its top-level lease alone until that lease
	// expires, and is never rewritten before then (except by Expire).
	foreign bool
	holders []holderRec // live, by token
	writers []writerRec // live
}

// withWriters sets the live registrations among ws.
func (s *keyState) withWriters(ws []writerRec, now int64) {
	s.writers = slices.DeleteFunc(slices.Clone(ws), func(w writerRec) bool { return w.Waiter == "" || now >= w.Expires })
}

// state decodes r at wall-clock time now (Unix nanoseconds).
func (r *record) state(now int64) keyState {
	var s keyState
	switch {
	case r.Mode == "" && len(r.Holders) == 0:
		if r.Owner != "" {
			s.holders = []holderRec{r.cover()}
		}
	case r.Mode == modeShared && r.Limit == 0 && validHolders(r.Holders):
		s.mode = driver.Shared
		s.holders = slices.Clone(r.Holders)
	case r.Mode == modeLimited && r.Limit >= 1 && r.Limit <= dlock.MaxLimit && validHolders(r.Holders):
		s.mode, s.limit = driver.Limited, r.Limit
		s.holders = slices.Clone(r.Holders)
	default:
		s.foreign = true
		if r.Owner != "" {
			s.holders = []holderRec{r.cover()}
		}
	}
	s.holders = slices.DeleteFunc(s.holders, func(h holderRec) bool { return now >= h.Expires })
	slices.SortFunc(s.holders, func(a, b holderRec) int { return cmp.Compare(a.Token, b.Token) })
	if len(s.holders) == 0 {
		s.mode, s.limit, s.foreign = driver.Exclusive, 0, false
	}
	return s
}

// validHolders reports whether a shared or limited record's holder list is
// one this version wrote: at least one holder, each with an owner and a
// token, no owner twice.
func validHolders(hs []holderRec) bool {
	if len(hs) == 0 {
		return false
	}
	seen := make(map[string]bool, len(hs))
	for _, h := range hs {
		if h.Owner == "" || h.Token == 0 || seen[h.Owner] {
			return false
		}
		seen[h.Owner] = true
	}
	return true
}

// store writes s back into r, keeping Key and Counter. An exclusive holder
// goes in the top-level fields only, as in records of earlier versions;
// shared and limited holders go in Holders, and the top-level fields
// repeat the one whose lease ends last, so that every reader of the
// top-level fields alone sees the key held while anyone holds it. A
// foreign state is never stored (callers check). The writers are stored
// apart (writeWriters).
func (r *record) store(s *keyState) {
	r.Owner, r.Token, r.Expires, r.Metadata = "", 0, 0, nil
	r.Mode, r.Limit, r.Holders = "", 0, nil
	if len(s.holders) == 0 {
		return
	}
	last := s.holders[0]
	for _, h := range s.holders[1:] {
		if h.Expires > last.Expires {
			last = h
		}
	}
	r.Owner, r.Token, r.Expires, r.Metadata = last.Owner, last.Token, last.Expires, last.Metadata
	switch s.mode {
	case driver.Shared:
		r.Mode, r.Holders = modeShared, s.holders
	case driver.Limited:
		r.Mode, r.Limit, r.Holders = modeLimited, s.limit, s.holders
	}
}

// maxToken is the highest token r has issued: its counter, or a holder's
// token if a record was ever written without raising the counter.
func (r *record) maxToken() uint64 {
	m := max(r.Counter, r.Token)
	for _, h := range r.Holders {
		m = max(m, h.Token)
	}
	return m
}

// find returns the index of owner's live lease, or -1.
func (s *keyState) find(owner string) int {
	return slices.IndexFunc(s.holders, func(h holderRec) bool { return h.Owner == owner })
}

// findWriter returns the index of waiter's live registration, or -1.
func (s *keyState) findWriter(waiter string) int {
	return slices.IndexFunc(s.writers, func(w writerRec) bool { return w.Waiter == waiter })
}

// removeWriter drops waiter's registration (every copy, should a record
// edited by hand list it twice) and reports whether there was one.
func (s *keyState) removeWriter(waiter string) bool {
	n := len(s.writers)
	s.writers = slices.DeleteFunc(s.writers, func(w writerRec) bool { return w.Waiter == waiter })
	return len(s.writers) < n
}

// public lists the live holders as other clients see them.
func (s *keyState) public(now int64) []dlock.Holder {
	out := make([]dlock.Holder, 0, len(s.holders))
	for _, h := range s.holders {
		out = append(out, dlock.Holder{Owner: h.Owner, Token: h.Token, TTL: time.Duration(h.Expires - now), Metadata: maps.Clone(h.Metadata), Mode: dlock.Mode(s.mode)})
	}
	return out
}

// outcome is what an attempt does to a key's state.
type outcome int

const (
	grantNew  outcome = iota // a new lease for req.Owner
	grantHave                // req.Owner holds already: a retry of a granted attempt
	refuse                   // held; nothing to write
	register                 // held; (re)register req.Waiter as a waiting writer
)

// needsWriters reports whether decide consults the waiting writers for
// req: for a shared request (kept out by them) and a blocking exclusive
// one (which registers, and is deregistered by its grant). An exclusive
// TryAcquire and a limited request never read the writers file.
func needsWriters(req *driver.Request) bool {
	return req.Mode == driver.Shared || req.Mode == driver.Exclusive && req.Waiter != ""
}

// decide is the lock logic of one attempt made at wall-clock time start
// and decided at now (with s.writers loaded when needsWriters(req)). For
// grantHave it returns the lease's token; for the refusals the error (a
// *dlock.NotAcquiredError, or a limit mismatch).
// It has no side effects, so it can answer from an unlocked read when the
// answer is a refusal that writes nothing.
func (s *keyState) decide(key string, req *driver.Request, now, start int64) (outcome, uint64, error) {
	if i := s.find(req.Owner); i >= 0 && !s.foreign {
		return grantHave, s.holders[i].Token, nil
	}
	if len(s.holders) == 0 {
		if req.Mode == driver.Shared && len(s.writers) > 0 {
			return refuse, 0, s.refusal(key, now, true)
		}
		return grantNew, 0, nil
	}
	if s.foreign {
		return refuse, 0, s.refusal(key, now, false)
	}
	if req.Mode == driver.Limited && s.mode == driver.Limited && req.Limit != s.limit {
		return refuse, 0, fmt.Errorf("%w: filelock key %q is held as a semaphore of %d permits, not %d", dlock.ErrLimitMismatch, key, s.limit, req.Limit)
	}
	switch {
	case req.Mode != s.mode, req.Mode == driver.Exclusive,
		req.Mode == driver.Limited && len(s.holders) >= s.limit:
		if req.Mode == driver.Exclusive && req.Waiter != "" && s.registrationDue(req.Waiter, req.TTL, now) {
			return register, 0, s.refusal(key, now, false)
		}
		return refuse, 0, s.refusal(key, now, false)
	case req.Mode == driver.Shared && len(s.writers) > 0:
		return refuse, 0, s.refusal(key, now, true)
	}
	return grantNew, 0, nil
}

// registrationDue reports whether waiter's registration is missing or
// past half its length: renewing it on every attempt would rewrite the
// writers file at each wake-up of every waiter, while the engine attempts at
// least every TTL/3, so renewing at half keeps it alive.
func (s *keyState) registrationDue(waiter string, ttl time.Duration, now int64) bool {
	i := s.findWriter(waiter)
	return i < 0 || s.writers[i].Expires-now < int64(ttl/2)
}

// refusal is the *dlock.NotAcquiredError of a refused attempt: the live
// holders and, when writers is set (a shared request kept out by writer
// preference), each waiting writer as a holder without an owner, with the
// time left on its registration.
func (s *keyState) refusal(key string, now int64, writers bool) *dlock.NotAcquiredError {
	na := &dlock.NotAcquiredError{Key: key, Holders: s.public(now)}
	if s.foreign {
		for i := range na.Holders {
			na.Holders[i].Mode = dlock.Exclusive
		}
	}
	if writers {
		for _, w := range s.writers {
			na.Holders = append(na.Holders, dlock.Holder{TTL: time.Duration(w.Expires - now), Mode: dlock.Exclusive})
		}
	}
	return na
}
