package redisproto

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Eviction is what a server says about evicting keys under memory
// pressure: its maxmemory (bytes, 0: no limit) and maxmemory-policy.
type Eviction struct {
	// Addr is the server that reported it ("" for a single client's
	// server).
	Addr      string
	MaxMemory int64
	Policy    string
	// Unknown: the server refused both CONFIG GET and INFO (an ACL user
	// without either): nothing is known.
	Unknown bool
}

// Evicts reports whether the server may evict keys, dlock's included:
// a memory limit and a policy other than noeviction. Every other policy
// may evict lock keys, which always carry a TTL (volatile-*) and are keys
// (allkeys-*).
func (e Eviction) Evicts() bool {
	return !e.Unknown && e.MaxMemory > 0 && e.Policy != "" && e.Policy != "noeviction"
}

// evictionCheck caches a Node's first conclusive Eviction reading.
type evictionCheck struct {
	mu   sync.Mutex
	done bool
	ev   Eviction
}

// Eviction reads, once per Node, whether its server (on a Cluster, each
// master; the first that evicts is reported) may evict keys: CONFIG GET
// maxmemory*, or, where CONFIG is denied or renamed, INFO memory. A
// failure to reach the server is returned and not cached, so the next
// call asks again; a server that refuses both commands gives an Eviction
// whose Unknown is set, cached.
func (n *Node) Eviction(ctx context.Context) (Eviction, error) {
	n.ev.mu.Lock()
	if n.ev.done {
		ev := n.ev.ev
		n.ev.mu.Unlock()
		return ev, nil
	}
	n.ev.mu.Unlock()
	ev, err := readEviction(ctx, n.Client)
	if err != nil {
		return Eviction{}, err
	}
	n.ev.mu.Lock()
	n.ev.done, n.ev.ev = true, ev
	n.ev.mu.Unlock()
	return ev, nil
}

// KnownEviction returns the Eviction reading Eviction cached, without
// asking the server: ok is false before the first conclusive reading.
func (n *Node) KnownEviction() (ev Eviction, ok bool) {
	n.ev.mu.Lock()
	defer n.ev.mu.Unlock()
	return n.ev.ev, n.ev.done
}

// readEviction asks c's server, or every master of a Cluster client.
func readEviction(ctx context.Context, c redis.UniversalClient) (Eviction, error) {
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		return serverEviction(ctx, c, "")
	}
	var (
		mu    sync.Mutex
		found Eviction
		seen  bool
	)
	err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		ev, err := serverEviction(ctx, m, m.Options().Addr)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if !seen || ev.Evicts() && !found.Evicts() || ev.Unknown && !found.Evicts() {
			found, seen = ev, true
		}
		return nil
	})
	if err != nil {
		return Eviction{}, err
	}
	return found, nil
}

// serverEviction asks one server: CONFIG GET, then INFO memory when
// CONFIG was refused (an error reply, not a failed connection).
func serverEviction(ctx context.Context, c redis.Cmdable, addr string) (Eviction, error) {
	ev := Eviction{Addr: addr}
	cfg, err := c.ConfigGet(ctx, "maxmemory*").Result()
	if err == nil {
		if v, ok := cfg["maxmemory"]; ok {
			ev.MaxMemory, _ = strconv.ParseInt(v, 10, 64)
			ev.Policy = cfg["maxmemory-policy"]
			return ev, nil
		}
	} else if !isErrorReply(err) {
		return Eviction{}, err
	}
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		if isErrorReply(err) {
			ev.Unknown = true
			return ev, nil
		}
		return Eviction{}, err
	}
	mm, okMem := InfoField(info, "maxmemory")
	pol, okPol := InfoField(info, "maxmemory_policy")
	if !okMem || !okPol {
		ev.Unknown = true
		return ev, nil
	}
	ev.MaxMemory, _ = strconv.ParseInt(mm, 10, 64)
	ev.Policy = pol
	return ev, nil
}

// isErrorReply reports whether err is the server's error reply (a
// refused command), not a failure to reach it.
func isErrorReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, redis.Nil)
}

// InfoField returns field's value in an INFO reply.
func InfoField(info, field string) (string, bool) {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), field+":"); ok {
			return v, true
		}
	}
	return "", false
}
