// Key layout: where a lock lives in etcd, the name of a key's queue
// directory (EscapeKey, QueuePrefix), and the value its entries hold.

package etcdlock

import (
	"encoding/json"
	"strings"
)

// EscapeKey is the name of key's queue directory: key with every '%'
// replaced by "%25" and every '/' by "%2F". Keys without those characters
// are unchanged. The encoding is injective and no encoded name contains
// '/', so the directory of one dlock key never holds another dlock key's
// entries. etcdctl and concurrency.Mutex do not escape: a lock of theirs
// named EscapeKey(key), or EscapeKey(key) + "/...", shares or lies inside
// key's directory (see docs/etcdlock.md, Keys with '/' or '%').
func EscapeKey(key string) string {
	if !strings.ContainsAny(key, "/%") {
		return key
	}
	var sb strings.Builder
	sb.Grow(len(key) + 8)
	for i := 0; i < len(key); i++ {
		switch c := key[i]; c {
		case '%':
			sb.WriteString("%25")
		case '/':
			sb.WriteString("%2F")
		default:
			sb.WriteByte(c)
		}
	}
	return sb.String()
}

// unescapeKey inverts EscapeKey. It is lenient: a '%' not followed by 25
// or 2F (a name that etcdctl or a concurrency.Mutex chose) stays as it is.
func unescapeKey(name string) string {
	if !strings.Contains(name, "%") {
		return name
	}
	var sb strings.Builder
	for i := 0; i < len(name); i++ {
		if name[i] == '%' && i+3 <= len(name) {
			switch name[i+1 : i+3] {
			case "25":
				sb.WriteByte('%')
				i += 2
				continue
			case "2F":
				sb.WriteByte('/')
				i += 2
				continue
			}
		}
		sb.WriteByte(name[i])
	}
	return sb.String()
}

// QueuePrefix is the etcd key prefix under which key's queue lives:
// "<prefix><EscapeKey(key)>/" (for example to inspect it with etcdctl).
// The zero Locker reports DefaultPrefix's.
func (l *Locker) QueuePrefix(key string) string {
	if l == nil || l.b == nil {
		return DefaultPrefix + EscapeKey(key) + "/"
	}
	return l.b.queuePrefix(key)
}

func (b *backend) queuePrefix(key string) string { return b.prefix + EscapeKey(key) + "/" }

// value is what dlock stores in its queue key (etcdctl stores nothing).
// Mode is empty for an exclusive entry (as in the entries of dlock
// versions without modes), "shared" or "limited"; Limit is a limited
// entry's number of permits.
type value struct {
	Owner    string            `json:"owner"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Mode     string            `json:"mode,omitempty"`
	Limit    int               `json:"limit,omitempty"`
}

func parseValue(v []byte) value {
	var out value
	_ = json.Unmarshal(v, &out)
	return out
}
