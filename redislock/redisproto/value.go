package redisproto

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Info describes a held lock as stored in Redis: an exclusive lease, one
// holder of a group, or (from List) a group with its Holders.
type Info struct {
	Key      string            `json:"key"`
	Owner    string            `json:"owner"`
	Token    uint64            `json:"token"`
	TTL      time.Duration     `json:"ttl"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// Group is "" for an exclusive lease, GroupShared or GroupLimited for
	// a group (List) and its holders; Limit is a limited group's limit.
	Group   string `json:"group,omitempty"`
	Limit   int    `json:"limit,omitempty"`
	Holders []Info `json:"holders,omitempty"`
}

// The modes of a group value "*<mode>|<token>|<limit>".
const (
	GroupShared  = "s"
	GroupLimited = "l"
)

// ParseGroup splits a group value "*<mode>|<token>|<limit>"; ok is false
// for any other value.
func ParseGroup(v string) (mode string, token uint64, limit int, ok bool) {
	if !strings.HasPrefix(v, "*") {
		return "", 0, 0, false
	}
	parts := strings.Split(v[1:], "|")
	if len(parts) != 3 || (parts[0] != GroupShared && parts[0] != GroupLimited) {
		return "", 0, 0, false
	}
	token, err1 := strconv.ParseUint(parts[1], 10, 64)
	limit, err2 := strconv.Atoi(parts[2])
	if err1 != nil || err2 != nil {
		return "", 0, 0, false
	}
	return parts[0], token, limit, true
}

// parseHolders reads a flat list of group holders (owner,
// "<token>|<metadata>", ms left, ...) as replied by the scripts.
func parseHolders(x any, mode string) []Info {
	a, _ := x.([]any)
	var out []Info
	for i := 0; i+2 < len(a); i += 3 {
		in := ParseValue(fmt.Sprint(a[i]) + "|" + fmt.Sprint(a[i+1]))
		in.Group = mode
		if ms, err := strconv.ParseInt(fmt.Sprint(a[i+2]), 10, 64); err == nil && ms > 0 {
			in.TTL = time.Duration(ms) * time.Millisecond
		}
		out = append(out, in)
	}
	return out
}

// FormatValue builds a lease value.
func FormatValue(owner string, token uint64, meta string) string {
	return owner + "|" + strconv.FormatUint(token, 10) + "|" + meta
}

// EncodeMetadata encodes metadata for FormatValue and the scripts: the
// JSON object json.Marshal gives (keys sorted, the same escaping), built
// without reflection for the strings that need no escaping, which are
// all of dlock's own (host, pid, acquired time).
func EncodeMetadata(md map[string]string) (string, error) {
	if len(md) == 0 {
		if md == nil {
			return "null", nil
		}
		return "{}", nil
	}
	var keys [8]string
	ks := keys[:0]
	size := 2
	for k, v := range md {
		if !plainJSON(k) || !plainJSON(v) {
			b, err := json.Marshal(md)
			return string(b), err
		}
		ks = append(ks, k)
		size += len(k) + len(v) + 6
	}
	slices.Sort(ks)
	var sb strings.Builder
	sb.Grow(size)
	sb.WriteByte('{')
	for i, k := range ks {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteByte('"')
		sb.WriteString(k)
		sb.WriteString(`":"`)
		sb.WriteString(md[k])
		sb.WriteByte('"')
	}
	sb.WriteByte('}')
	return sb.String(), nil
}

// plainJSON reports whether json.Marshal writes s as itself between
// quotes: printable ASCII without '"', '\\' and the characters it escapes
// for HTML ('<', '>', '&').
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c >= 0x7f, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

// ParseValue splits a lease value "<owner>|<token>|<metadata json>".
func ParseValue(v string) Info {
	var in Info
	parts := strings.SplitN(v, "|", 3)
	in.Owner = parts[0]
	if len(parts) > 1 {
		in.Token, _ = strconv.ParseUint(parts[1], 10, 64)
	}
	if len(parts) > 2 {
		_ = json.Unmarshal([]byte(parts[2]), &in.Metadata)
	}
	return in
}

// Outcome is the result of an acquisition attempt on one node.
type Outcome struct {
	Granted bool
	// Token is the token assigned (Acquire) or the node's counter floor,
	// max(counter, server time in µs) (Grant).
	Token uint64
	// Recorded: the grant recorded its proposed token (Grant).
	Recorded bool
	// Now is the server's time in µs when it granted (Grant).
	Now int64
	// Holder and PTTL describe the current holder when not granted. When
	// the key is free but reserved for the waiter the last release woke,
	// Holder has no owner, its Metadata says MetaReservedForWaiter, and
	// PTTL is the reservation left.
	Holder Info
	PTTL   time.Duration
	// ReservedFor is the wait id of the waiter the key is reserved for.
	ReservedFor string
	// Group, Limit and Holders describe the shared or limited holders
	// holding the key (Holder is then unset).
	Group   string
	Limit   int
	Holders []Info
	// LimitMismatch is the holders' limit when a limited request named
	// another one.
	LimitMismatch int
	// WriterWaiting: a shared request was refused because a writer waits.
	WriterWaiting bool
}

// MetaReservedForWaiter is the metadata key naming the waiter a free key
// is reserved for (see HandoffReserve), reported in place of a holder.
const MetaReservedForWaiter = "reserved_for_waiter"

// reservedFor returns the wait id of a reservation marker
// ("|<token>|<wait id>|<until ms>").
func reservedFor(v string) (string, bool) {
	if !strings.HasPrefix(v, "|") {
		return "", false
	}
	parts := strings.Split(v[1:], "|")
	if len(parts) != 3 || parts[1] == "" {
		return "", false
	}
	return parts[1], true
}

func parseOutcome(res []any, err error) (Outcome, error) {
	if err != nil {
		return Outcome{}, err
	}
	if len(res) >= 2 && res[0] == int64(1) {
		s, ok := res[1].(string)
		if !ok {
			s = fmt.Sprint(res[1])
		}
		tok, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return Outcome{}, fmt.Errorf("bad token %v", res[1])
		}
		o := Outcome{Granted: true, Token: tok, Recorded: len(res) >= 3 && res[2] == int64(1)}
		if len(res) >= 4 {
			if s, ok := res[3].(string); ok {
				o.Now, _ = strconv.ParseInt(s, 10, 64)
			}
		}
		return o, nil
	}
	var o Outcome
	if len(res) >= 2 && res[0] == int64(2) {
		o.LimitMismatch, _ = strconv.Atoi(fmt.Sprint(res[1]))
		return o, nil
	}
	if len(res) >= 3 && res[0] == int64(3) {
		o.WriterWaiting = true
		if pttl, ok := res[1].(int64); ok && pttl > 0 {
			o.PTTL = time.Duration(pttl) * time.Millisecond
		}
		o.Group = GroupShared
		o.Holders = parseHolders(res[2], GroupShared)
		return o, nil
	}
	if len(res) >= 3 {
		if mode, _, limit, ok := ParseGroup(fmt.Sprint(res[1])); ok {
			o.Group, o.Limit = mode, limit
			if len(res) >= 4 {
				o.Holders = parseHolders(res[3], mode)
			}
			if pttl, ok := res[2].(int64); ok && pttl > 0 {
				o.PTTL = time.Duration(pttl) * time.Millisecond
			}
			return o, nil
		}
		v := fmt.Sprint(res[1])
		if id, ok := reservedFor(v); ok {
			o.ReservedFor = id
			o.Holder = Info{Metadata: map[string]string{MetaReservedForWaiter: id}}
		} else {
			o.Holder = ParseValue(v)
		}
		if pttl, ok := res[2].(int64); ok && pttl > 0 {
			o.PTTL = time.Duration(pttl) * time.Millisecond
		}
	}
	return o, nil
}
