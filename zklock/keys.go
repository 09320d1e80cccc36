// Keys and znodes: how a lock key maps to its znode path, and how the
// queue's ephemeral sequential nodes are named and parsed.

package zklock

import (
	"encoding/json"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// EscapeKey returns the znode name of a lock key: the key itself where
// ZooKeeper accepts it, with '%', '/', control characters and the code
// points ZooKeeper refuses in paths (U+007F–U+009F, U+D800–U+F8FF,
// U+FFF0–U+FFFF, and everything beyond U+FFFF, which Java stores as
// surrogates) percent-encoded as their UTF-8 bytes. "." and "..", which
// ZooKeeper reserves, and "zookeeper", reserved at the root, are encoded
// too. So every key is one znode directly under the prefix, and
// hierarchical keys ("orders/42" and "orders") are siblings that never
// contend with each other.
func EscapeKey(key string) string {
	switch key {
	case ".", "..":
		return strings.Repeat("%2E", len(key))
	case "zookeeper":
		return "%7Aookeeper"
	}
	var b strings.Builder
	for i := 0; i < len(key); {
		r, w := utf8.DecodeRuneInString(key[i:])
		if plain(r, w) {
			b.WriteString(key[i : i+w])
		} else {
			for j := i; j < i+w; j++ {
				b.WriteByte('%')
				b.WriteByte(hexDigits[key[j]>>4])
				b.WriteByte(hexDigits[key[j]&15])
			}
		}
		i += w
	}
	return b.String()
}

const hexDigits = "0123456789ABCDEF"

// plain reports whether rune r (w bytes of valid UTF-8) may stand for
// itself in a znode name.
func plain(r rune, w int) bool {
	switch {
	case r == utf8.RuneError && w <= 1:
		return false
	case r == '%' || r == '/':
		return false
	case r < 0x20 || (r >= 0x7F && r <= 0x9F):
		return false
	case r >= 0xD800 && r <= 0xF8FF:
		return false
	case r >= 0xFFF0:
		return false
	}
	return true
}

// unescapeKey reverses EscapeKey. A name EscapeKey cannot have produced
// (a node someone else created under the prefix) reports false.
func unescapeKey(name string) (string, bool) {
	if !strings.Contains(name, "%") {
		return name, name != "" && name != "zookeeper"
	}
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(name) {
			return "", false
		}
		v, err := strconv.ParseUint(name[i+1:i+3], 16, 8)
		if err != nil {
			return "", false
		}
		b.WriteByte(byte(v))
		i += 2
	}
	key := b.String()
	return key, EscapeKey(key) == name
}

// Queue nodes are named "_c_<owner>-<tag><sequence>": the "_c_<id>-"
// protection prefix (a client that lost the reply to its create finds its
// node again by id; ZOOKEEPER-1262), a tag naming the request's mode and
// ZooKeeper's 10-digit sequence number. The tags are "lock-" (exclusive),
// "read-" (shared) and "sem-<limit>-" (limited, with the semaphore's size
// in decimal). Curator's InterProcessMutex and go-zookeeper's Lock name
// their nodes "lock-" the same way, so their holders are seen as
// exclusive holders too.
const (
	protectPrefix = "_c_"
	lockInfix     = "lock-"
	readInfix     = "read-"
	semInfix      = "sem-"
	seqDigits     = 10
)

// nodePrefix is the name given to Create for owner's queue node of the
// given mode (and limit, for driver.Limited); ZooKeeper appends the
// sequence number.
func nodePrefix(owner string, mode driver.Mode, limit int) string {
	switch mode {
	case driver.Shared:
		return protectPrefix + owner + "-" + readInfix
	case driver.Limited:
		return protectPrefix + owner + "-" + semInfix + strconv.Itoa(limit) + "-"
	}
	return protectPrefix + owner + "-" + lockInfix
}

// qnode is one queue node of a key.
type qnode struct {
	name  string
	owner string // the protection id (dlock's owner id); "" if none
	seq   int64
	mode  driver.Mode
	limit int // for driver.Limited: the semaphore's size
}

// parseNode parses a child of a key's znode as a queue node.
func parseNode(name string) (qnode, bool) {
	if len(name) < seqDigits {
		return qnode{}, false
	}
	digits := name[len(name)-seqDigits:]
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return qnode{}, false
		}
	}
	seq, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || seq < 0 {
		return qnode{}, false
	}
	n := qnode{name: name, seq: seq}
	head := name[:len(name)-seqDigits]
	switch {
	case strings.HasSuffix(head, lockInfix):
		n.mode, head = driver.Exclusive, head[:len(head)-len(lockInfix)]
	case strings.HasSuffix(head, readInfix):
		n.mode, head = driver.Shared, head[:len(head)-len(readInfix)]
	case strings.HasSuffix(head, "-"):
		i := strings.LastIndex(head[:len(head)-1], semInfix)
		if i < 0 {
			return qnode{}, false
		}
		lim, ok := parseLimit(head[i+len(semInfix) : len(head)-1])
		if !ok {
			return qnode{}, false
		}
		n.mode, n.limit, head = driver.Limited, lim, head[:i]
	default:
		return qnode{}, false
	}
	if head != "" {
		if !strings.HasPrefix(head, protectPrefix) || !strings.HasSuffix(head, "-") || len(head) < len(protectPrefix)+1 {
			return qnode{}, false
		}
		n.owner = head[len(protectPrefix) : len(head)-1]
	}
	return n, true
}

// parseLimit parses a semaphore size as nodePrefix writes it: decimal
// without leading zeros, 1 to dlock.MaxLimit.
func parseLimit(s string) (int, bool) {
	if s == "" || len(s) > 7 || s[0] == '0' {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int(s[i]-'0')
	}
	return n, n >= 1 && n <= dlock.MaxLimit
}

// queueOf returns the queue nodes among children, in queue order (lowest
// sequence first: the holder).
func queueOf(children []string) []qnode {
	q := make([]qnode, 0, len(children))
	for _, c := range children {
		if n, ok := parseNode(c); ok {
			q = append(q, n)
		}
	}
	sort.Slice(q, func(i, j int) bool { return q[i].seq < q[j].seq })
	return q
}

// value is the data of a queue node: who holds or waits, for other
// clients and `dlock ls`.
type value struct {
	Owner    string            `json:"owner"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// Granted marks a limited node that waited and was then granted: the
	// write wakes the waiter behind it (see Queue).
	Granted bool `json:"granted,omitempty"`
}

func encodeValue(owner string, md map[string]string) []byte {
	b, _ := json.Marshal(value{Owner: owner, Metadata: md})
	return b
}

func encodeGranted(owner string, md map[string]string) []byte {
	b, _ := json.Marshal(value{Owner: owner, Metadata: md, Granted: true})
	return b
}

func parseValue(v []byte) value {
	var out value
	_ = json.Unmarshal(v, &out)
	return out
}

// validPrefix reports whether p is a ZooKeeper path usable as the prefix:
// absolute, no trailing '/', no empty, "." or ".." segments, no character
// ZooKeeper refuses.
func validPrefix(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	if p == "/" {
		return true
	}
	for _, seg := range strings.Split(p[1:], "/") {
		if seg == "" || seg == "." || seg == ".." {
			return false
		}
		for i := 0; i < len(seg); {
			r, w := utf8.DecodeRuneInString(seg[i:])
			if !plain(r, w) && r != '%' {
				return false
			}
			i += w
		}
	}
	return true
}
