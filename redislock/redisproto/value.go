package redisproto

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Info describes a held lock as stored in Redis.
type Info struct {
	Key      string            `json:"key"`
	Owner    string            `json:"owner"`
	Token    uint64            `json:"token"`
	TTL      time.Duration     `json:"ttl"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// FormatValue builds a lease value.
func FormatValue(owner string, token uint64, meta string) string {
	return owner + "|" + strconv.FormatUint(token, 10) + "|" + meta
}

// EncodeMetadata encodes metadata for FormatValue and the scripts.
func EncodeMetadata(md map[string]string) (string, error) {
	b, err := json.Marshal(md)
	return string(b), err
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
	// Holder and PTTL describe the current holder when not granted. When
	// the key is free but reserved for the waiter the last release woke,
	// Holder has no owner, its Metadata says MetaReservedForWaiter, and
	// PTTL is the reservation left.
	Holder Info
	PTTL   time.Duration
	// ReservedFor is the wait id of the waiter the key is reserved for.
	ReservedFor string
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
		tok, err := strconv.ParseUint(fmt.Sprint(res[1]), 10, 64)
		if err != nil {
			return Outcome{}, fmt.Errorf("bad token %v", res[1])
		}
		return Outcome{Granted: true, Token: tok}, nil
	}
	var o Outcome
	if len(res) >= 3 {
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
