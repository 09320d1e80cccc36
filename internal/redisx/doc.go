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
// The "{KEY}" hash tag keeps lease and counter in one Cluster slot. Owner
// checks compare the "<owner>|" prefix of the value: owners are 32 random
// hex digits, so the prefix identifies the holder exactly, and an attempt
// whose reply was lost can be undone knowing only the owner.
package redisx
