// Package redisx holds the per-node Redis protocol shared by redislock
// (one deployment) and redlock (N independent masters): key layout, Lua
// scripts, owner-checked refresh and release, pipelined renewal, release
// notifications over pub/sub, and listing. It is internal to dlock.
//
// Key layout for lock KEY under prefix P:
//
//	P:{KEY}           the lease: "<owner>|<token>|<metadata json>", PX ttl
//	P:{KEY}:fence     the fencing counter (expires a retention period after
//	                  the last acquisition)
//	P:{KEY}:released  the pub/sub channel a release publishes on
//
//	P:{KEY}:waiters   the queue of waiters to wake, one per release
//
// The "{KEY}" hash tag keeps every key of a lock in one Cluster slot. A KEY
// starting with '}' would make an empty tag (Cluster then hashes the whole
// key, and the keys of one lock land in different slots), so such keys are
// written with a NUL byte in front ("P:{\x00}x}"); every other KEY is used
// as it is (see HashTag). Owner checks compare the "<owner>|" prefix of
// the value: owners are 32 random hex digits, so the prefix identifies the
// holder exactly, and an attempt whose reply was lost can be undone knowing
// only the owner.
//
// Every script is safe to execute twice, as go-redis does when a reply is
// lost on the way back: an acquisition that finds its own owner's lease is
// granted that lease again, a release that finds its own release marker
// (or the lease the next holder took from it) reports success, refresh and
// commit are idempotent.
//
// Nothing a caller waits for blocks on a stalled link beyond what the
// caller allows: batch renewals report each server's results as they
// arrive, one pipeline per server (per master on a Cluster), and the
// pub/sub hub never waits on the network when a subscription closes.
package redisx
