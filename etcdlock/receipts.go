// Release receipts: the key a release puts in the transaction that deletes
// its entry, proving later that the delete was ours, and the clean-up of
// receipts no release will ask for again (spent).

package etcdlock

import (
	"strconv"
	"strings"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const (
	// receiptDir is the directory, under the Locker's prefix, of release
	// receipts: "<prefix>\x00dlock-released/<lease hex>/<create revision>".
	// dlock keys cannot contain NUL, so no queue directory
	// "<prefix><EscapeKey(KEY)>/" is, or is inside, this directory.
	receiptDir = "\x00dlock-released/"
	// maxSpentOps bounds the deletes of spent receipts that one
	// transaction carries along.
	maxSpentOps = 32
)

// receiptKey is the key that a release (or the retried delete of a
// released entry) puts, on the entry's lease, in the same transaction as
// its delete by create revision: "<prefix>\x00dlock-released/<lease
// hex>/<create revision>". Its presence proves that a request of ours
// deleted the entry while it was still ours.
func (e *entry) receiptKey() string {
	return e.b.prefix + receiptDir + strconv.FormatInt(int64(e.s.id), 16) + "/" + strconv.FormatInt(e.rev, 10)
}

// isReceipt reports whether k (a full etcd key) is a release receipt, of
// this Locker's prefix or any other.
func isReceipt(k string) bool { return strings.Contains(k, receiptDir) }

// takeSpentLocked returns up to maxSpentOps deletes of spent receipts,
// removing them from the set; a caller whose request fails gives them
// back. A receipt becomes spent only together with its entry's
// deletedByUs, so a caller that saw deletedByUs unset for an entry in the
// same hold of b.mu never deletes the receipt it puts. b.mu held.
func (b *backend) takeSpentLocked() []clientv3.Op {
	if len(b.spent) == 0 {
		return nil
	}
	ops := make([]clientv3.Op, 0, min(len(b.spent), maxSpentOps))
	for k := range b.spent {
		if len(ops) == maxSpentOps {
			break
		}
		delete(b.spent, k)
		ops = append(ops, clientv3.OpDelete(k))
	}
	return ops
}

// giveBackSpent returns the deletes of a failed request to the set.
func (b *backend) giveBackSpent(ops []clientv3.Op) {
	if len(ops) == 0 {
		return
	}
	b.mu.Lock()
	for _, op := range ops {
		b.spent[string(op.KeyBytes())] = struct{}{}
	}
	b.mu.Unlock()
}

// hasReceipt reports whether rs, the answer to an else branch that reads a
// receipt (first), found it.
func hasReceipt(rs []*etcdserverpb.ResponseOp) bool {
	return len(rs) > 0 && rs[0].GetResponseRange().GetCount() > 0
}
