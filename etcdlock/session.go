// Sessions: the etcd leases shared by the locks and waiters of a Locker that
// ask for the same TTL, their keep-alives and revocation, and their slots
// (at most one entry per key on each lease).

package etcdlock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/background"
)

// session is a lease shared by the locks and waiters of one Locker that
// ask for the same lease TTL (in whole seconds), like a
// concurrency.Session. A session has at most one entry per key (its slot
// for that key), so two locks on one key taken through one Locker have
// different leases, and so different queue keys, and exclude each other.
//
// A slot is freed only once its entry is known to be deleted: an entry
// whose delete failed (or whose creation has an unknown outcome) keeps
// its slot as an orphan until a later delete succeeds, so no later lock
// can ever be handed the same entry, and its delete is retried with the
// session's next keep-alive and before the next attempt on that key.
type session struct {
	id  clientv3.LeaseID
	ttl time.Duration // as granted by the server (≥ the TTL asked for)

	// guarded by backend.mu
	slots     map[string]*entry // key → this lease's entry for key (live or orphan)
	live      int               // entries in slots that are live
	validFrom time.Time         // start of the last successful grant or keep-alive
	dead      bool              // expired, revoked or forgotten
	retired   bool              // takes no new entry; revoked once none is live
	revoking  bool
}

func leaseSeconds(ttl time.Duration) int64 {
	return int64((ttl + time.Second - 1) / time.Second)
}

// validity returns the start from which a lock on s counts, at now,
// without a round trip, if s is fresh enough. A lock's TTL is its lease's
// (s.ttl, what etcd applied: whole seconds, at least the server's minimum),
// and the server holds the lease until at least validFrom + s.ttl, so the
// lock counts from validFrom, if that leaves it at least 2/3 of its TTL
// (the watchdog renews it a third of the TTL after that start).
// s.mu (backend.mu) held.
func (s *session) validity(now time.Time) (time.Time, bool) {
	if now.Sub(s.validFrom) < s.ttl/3 {
		return s.validFrom, true
	}
	return time.Time{}, false
}

// attachLocked creates an entry for req on s, taking s's slot for the key.
// b.mu held.
func (b *backend) attachLocked(s *session, req *driver.Request, val string) *entry {
	e := &entry{b: b, s: s, key: req.Key, owner: req.Owner, val: val,
		myKey: b.queuePrefix(req.Key) + strconv.FormatInt(int64(s.id), 16)}
	s.slots[req.Key] = e
	s.live++
	return e
}

// pickLocked returns a usable session for key among those asking for sec
// seconds, forgetting the ones that are gone. b.mu held.
func (b *backend) pickLocked(key string, sec int64, now time.Time) *session {
	list := b.sessions[sec]
	keep := list[:0]
	var s *session
	for _, c := range list {
		if c.dead || (c.live == 0 && !c.revoking && !now.Before(c.validFrom.Add(c.ttl))) {
			b.forgetLocked(c) // expired on the server by now, or revoked
			continue
		}
		keep = append(keep, c)
		if s == nil && !c.retired && c.slots[key] == nil {
			s = c
		}
	}
	clear(list[len(keep):])
	b.sessions[sec] = keep
	return s
}

// forgetLocked drops s: its lease is gone, and so are its entries. b.mu held.
func (b *backend) forgetLocked(s *session) {
	s.dead = true
	for _, e := range s.slots {
		b.goneLocked(e)
	}
}

func (b *backend) revokeDueLocked(s *session) bool {
	if s.retired && s.live == 0 && !s.dead && !s.revoking {
		s.revoking = true
		return true
	}
	return false
}

// revoke revokes a retired session's lease in the background.
//
// The revoke would delete the receipts of releases whose outcome is still
// unknown (a reply lost), and with them the proof that a retried release
// needs. Those entries are first deleted by create revision (which writes
// their receipt and reads any earlier one, settling each release); if that
// fails, the lease is not revoked but left to expire.
func (b *backend) revoke(s *session) {
	background.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), dlock.DefaultReleaseTimeout)
		defer cancel()
		b.mu.Lock()
		var unsettled []*entry
		for _, e := range s.slots {
			if e.state == entryOrphan && e.released && !e.deletedByUs {
				unsettled = append(unsettled, e)
			}
		}
		b.mu.Unlock()
		if len(unsettled) == 0 || b.sweep(ctx, unsettled) == nil {
			_, _ = b.client.Revoke(ctx, s.id)
		}
		b.mu.Lock()
		// Forget it either way: nobody keeps it alive any more, so a lease
		// that could not be revoked expires on its own.
		b.forgetLocked(s)
		b.mu.Unlock()
	})
}

// killSession records that s's lease is gone (expired or revoked behind
// our back).
func (b *backend) killSession(s *session) {
	b.mu.Lock()
	b.forgetLocked(s)
	b.mu.Unlock()
}

// keptAlive records a successful keep-alive of s sent at start.
func (b *backend) keptAlive(s *session, start time.Time) {
	b.mu.Lock()
	if start.After(s.validFrom) {
		s.validFrom = start
	}
	b.mu.Unlock()
}

// keepAlive renews s's lease once. A lease that is gone returns an error
// wrapping dlock.ErrNotHeld and forgets s.
func (b *backend) keepAlive(ctx context.Context, s *session) error {
	start := time.Now()
	rctx, cancel := b.rpc(ctx)
	_, err := b.client.KeepAliveOnce(rctx, s.id)
	cancel()
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		b.killSession(s)
		return fmt.Errorf("%w: etcd lease %x expired or was revoked", dlock.ErrNotHeld, int64(s.id))
	case err != nil:
		return unreachable(fmt.Errorf("dlock: etcd keep-alive: %w", err))
	}
	b.keptAlive(s, start)
	return nil
}

// newEntry reserves a slot for req on a live session with req's TTL in
// whole seconds (a shared one if one is free for the key, else a new
// lease) and returns the entry and the start from which a lock on it
// counts. peek, if not nil, is called before the first round trip that
// this takes.
func (b *backend) newEntry(ctx context.Context, req *driver.Request, peek func()) (*entry, time.Time, error) {
	val := value{Owner: req.Owner, Metadata: req.Metadata}
	switch req.Mode {
	case driver.Shared:
		val.Mode = modeShared
	case driver.Limited:
		val.Mode, val.Limit = modeLimited, req.Limit
	}
	v, err := json.Marshal(val)
	if err != nil {
		return nil, time.Time{}, err
	}
	sval := string(v)
	sec := leaseSeconds(req.TTL)
	now := time.Now()
	b.mu.Lock()
	if s := b.pickLocked(req.Key, sec, now); s != nil {
		e := b.attachLocked(s, req, sval)
		start, fresh := s.validity(now)
		b.mu.Unlock()
		if fresh {
			return e, start, nil
		}
		if peek != nil {
			peek()
			peek = nil
		}
		start = time.Now()
		err := b.keepAlive(ctx, s)
		if err == nil {
			return e, start, nil
		}
		b.gone(e) // nothing was created
		if !errors.Is(err, dlock.ErrNotHeld) {
			return nil, time.Time{}, err
		}
		// The lease expired: take a new one.
	} else {
		b.mu.Unlock()
	}
	if peek != nil {
		peek()
	}
	start := time.Now()
	rctx, cancel := b.rpc(ctx)
	resp, err := b.client.Grant(rctx, sec)
	cancel()
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("dlock: etcd lease grant: %w", err)
	}
	s := &session{id: resp.ID, ttl: time.Duration(resp.TTL) * time.Second, slots: map[string]*entry{}, validFrom: start}
	b.mu.Lock()
	b.sessions[sec] = append(b.sessions[sec], s)
	e := b.attachLocked(s, req, sval)
	b.mu.Unlock()
	return e, start, nil
}

// leaseGone reports whether a create failed because e's lease no longer
// exists (nothing was created); it then forgets the session.
func (b *backend) leaseGone(e *entry, err error) bool {
	if !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return false
	}
	b.gone(e)
	b.killSession(e.s)
	return true
}
