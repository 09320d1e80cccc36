package redisproto

import (
	"strings"
	"time"
)

// HashTag encodes a dlock key for the inside of the braces of a Redis key
// ("P:{<tag>}..."), where it must form a non-empty Cluster hash tag so that
// every Redis key of one lock lands in one slot. Cluster hashes the part
// between the first '{' and the first '}' after it, and hashes the whole
// key when that part is empty: a key starting with '}' would have an empty
// tag. Such keys get a NUL byte in front ("\x00}x"), which makes the tag
// "\x00"; every other key is used as it is (the layout of earlier
// versions). dlock keys never contain NUL, so the encoding is injective
// and DecodeHashTag undoes it.
func HashTag(key string) string {
	if strings.HasPrefix(key, "}") {
		return "\x00" + key
	}
	return key
}

// DecodeHashTag is the inverse of HashTag.
func DecodeHashTag(tag string) string { return strings.TrimPrefix(tag, "\x00") }

// LockKey is the key holding key's lease.
func (n *Node) LockKey(key string) string { return n.Prefix + ":{" + HashTag(key) + "}" }

// FenceKey is the key holding key's quorum fencing counter (Redlock).
func (n *Node) FenceKey(key string) string { return n.LockKey(key) + fenceSuffix }

// WaitersKey is the queue of waiters to wake, one per release.
func (n *Node) WaitersKey(key string) string { return n.LockKey(key) + waitersSuffix }

// ReceiptsKey is the list of the tokens of key's last released leases
// whose markers a later acquisition took over (see Receipts).
func (n *Node) ReceiptsKey(key string) string { return n.LockKey(key) + receiptsSuffix }

// The suffixes of a lock's other keys and of its waiters' channels, after
// the lock key (see the package documentation). The scripts' callers
// build all of them from one LockKey.
const (
	fenceSuffix      = ":fence"
	waitersSuffix    = ":waiters"
	receiptsSuffix   = ":rel"
	channelSuffix    = ":w:"
	holdersSuffix    = ":h"
	holderDataSuffix = ":hd"
	writersSuffix    = ":wr"
	permitSuffix     = ":pk"
	breakChanSuffix  = ":b"
)

// HoldersKey is the sorted set of the shared or limited holders of key,
// scored by their expiry (ms, server clock).
func (n *Node) HoldersKey(key string) string { return n.LockKey(key) + holdersSuffix }

// WritersKey is the sorted set of key's waiting writers, scored by the
// end of their registration (ms, server clock).
func (n *Node) WritersKey(key string) string { return n.LockKey(key) + writersSuffix }

// Release receipts. A release leaves the marker "|<token>" in the lock
// key; an acquisition that later overwrites the marker records its token
// in the key's receipt list, which keeps the last Receipts tokens and
// expires ReceiptRetention after the latest. A release retried after its
// first attempt took effect (the reply was lost) finds its token in the
// marker or the receipts and reports success, however often the key
// changed hands meanwhile, within those limits: a retry after more than
// Receipts further hand-overs, or more than ReceiptRetention after the
// latest one, is reported as a lease no longer held. Recording at the
// hand-over rather than at the release keeps the uncontended cycle free of
// an extra key: a release whose key nobody takes over writes nothing but
// its marker. A hand-over costs an LPUSH and a PEXPIRE (and, every
// Receipts hand-overs, an LTRIM) in the acquisition's script.
const (
	Receipts         = 8
	ReceiptRetention = time.Minute
)

// BreakChannel is the channel a break of key publishes on, for its
// holders' clients to check their leases at once.
func (n *Node) BreakChannel(key string) string { return n.LockKey(key) + breakChanSuffix }

// WaiterChannel is the channel waiter id listens on for its turn.
func (n *Node) WaiterChannel(key, id string) string { return n.waiterPrefix(key) + id }

func (n *Node) waiterPrefix(key string) string { return n.LockKey(key) + channelSuffix }

// withSuffixes returns lk followed by lk+suffix for each of suffixes,
// in one allocation for the strings (they share one backing array) and
// one for the slice: a script's KEYS are built on every request.
func withSuffixes(lk string, suffixes ...string) []string {
	size := len(lk) * (len(suffixes) + 1)
	for _, s := range suffixes {
		size += len(s)
	}
	var b strings.Builder
	b.Grow(size)
	b.WriteString(lk)
	for _, s := range suffixes {
		b.WriteString(lk)
		b.WriteString(s)
	}
	all := b.String()
	keys := make([]string, len(suffixes)+1)
	keys[0], all = all[:len(lk)], all[len(lk):]
	for i, s := range suffixes {
		n := len(lk) + len(s)
		keys[i+1], all = all[:n], all[n:]
	}
	return keys
}

// decodeLockKey is the dlock key of lock key k (the inverse of LockKey).
func (n *Node) decodeLockKey(k string) string {
	return DecodeHashTag(strings.TrimSuffix(strings.TrimPrefix(k, n.Prefix+":{"), "}"))
}

// HandedOn is the score from which a waiter queue holds the readers that
// handed a reservation on while a writer was registered (the queue's
// scores are otherwise the waiters' clocks in µs, far below it, and
// below 2^53 with it): a hand-on wakes only waiters below it, so it
// reaches every other queued waiter once and never comes back (lua
// wake_unhanded). A release wakes them in order as any other waiter.
const HandedOn = 4_000_000_000_000_000
