// Modes: which nodes of a key's queue hold the key, for exclusive, shared
// and limited requests, and the limit mismatch of a permit.

package zklock

import (
	"fmt"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// The read-write and semaphore recipe. A key's queue holds nodes of every
// mode in FIFO order; which of them hold the key follows from the order
// alone:
//
//   - an exclusive node holds it when it is first;
//   - a shared node when every node ahead of it is shared;
//   - a limited node of limit N when every node ahead of it is a limited
//     node of limit N and fewer than N are.
//
// So the holders are always a prefix of the queue (holdersOf), a node
// waits behind every node queued before it whatever their modes (writer
// preference: a reader that comes after a waiting writer waits for it),
// and a waiter's turn can only come when some node ahead of it goes.

// compatible reports whether a node of b's request may hold the key
// together with a: both shared, or both limited with the same limit.
func compatible(a, b qnode) bool {
	switch a.mode {
	case driver.Shared:
		return b.mode == driver.Shared
	case driver.Limited:
		return b.mode == driver.Limited && a.limit == b.limit
	}
	return false
}

// holdersOf returns the prefix of q that holds the key (empty for an empty
// queue).
func holdersOf(q []qnode) []qnode {
	if len(q) == 0 {
		return nil
	}
	n := 1
	for n < len(q) && compatible(q[0], q[n]) && (q[0].mode != driver.Limited || n < q[0].limit) {
		n++
	}
	return q[:n]
}

// blocker is the last node ahead of position i that q[i] cannot hold the
// key with (-1 if none): q[i] waits at least until it is gone.
func blocker(q []qnode, i int) int {
	for j := i - 1; j >= 0; j-- {
		if q[i].mode == driver.Exclusive || !compatible(q[i], q[j]) {
			return j
		}
	}
	return -1
}

// admitted reports whether q[i] holds the key.
func admitted(q []qnode, i int) bool {
	if blocker(q, i) >= 0 {
		return false
	}
	return q[i].mode != driver.Limited || i < q[i].limit
}

// mismatch is the error of a limited request on a key whose holders are a
// semaphore of another size (nil otherwise).
func (e *entry) mismatch(held []qnode) error {
	if e.mode != driver.Limited || len(held) == 0 || held[0].mode != driver.Limited || held[0].limit == e.limit {
		return nil
	}
	return fmt.Errorf("%w: zookeeper key %q is held as a semaphore of %d permits, not %d", dlock.ErrLimitMismatch, e.key, held[0].limit, e.limit)
}
