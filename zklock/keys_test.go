package zklock

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dlock-go/dlock/driver"
)

func TestEscapeKey(t *testing.T) {
	for key, want := range map[string]string{
		"orders":               "orders",
		"orders/42":            "orders%2F42",
		"a%2Fb":                "a%252Fb",
		".":                    "%2E",
		"..":                   "%2E%2E",
		"...":                  "...",
		"zookeeper":            "%7Aookeeper",
		"tab\there":            "tab%09here",
		"del\x7f":              "del%7F",
		"émoji😀":               "émoji%F0%9F%98%80",
		"\ue000priv":           "%EE%80%80priv",
		"_c_x-lock-0000000001": "_c_x-lock-0000000001",
	} {
		if got := EscapeKey(key); got != want {
			t.Errorf("EscapeKey(%q) = %q, want %q", key, got, want)
		}
		if back, ok := unescapeKey(EscapeKey(key)); !ok || back != key {
			t.Errorf("unescapeKey(EscapeKey(%q)) = %q, %v", key, back, ok)
		}
	}
	for _, name := range []string{"a%2", "a%zz", "a%2f", "zookeeper", ""} {
		if k, ok := unescapeKey(name); ok {
			t.Errorf("unescapeKey(%q) = %q, true; want false", name, k)
		}
	}
}

func TestParseNode(t *testing.T) {
	for name, want := range map[string]qnode{
		"_c_0123abcd-lock-0000000007":                             {owner: "0123abcd", seq: 7},
		"_c_2f3a6b3e-1a7c-4e0e-9d55-3a1f7c2b9e11-lock-0000000010": {owner: "2f3a6b3e-1a7c-4e0e-9d55-3a1f7c2b9e11", seq: 10},
		"lock-0000000003":                                         {seq: 3},
		"_c_0123abcd-read-0000000004":                             {owner: "0123abcd", seq: 4, mode: driver.Shared},
		"read-0000000005":                                         {seq: 5, mode: driver.Shared},
		"_c_0123abcd-sem-3-0000000006":                            {owner: "0123abcd", seq: 6, mode: driver.Limited, limit: 3},
		"_c_0123abcd-sem-1048576-0000000008":                      {owner: "0123abcd", seq: 8, mode: driver.Limited, limit: 1 << 20},
	} {
		got, ok := parseNode(name)
		want.name = name
		if !ok || got != want {
			t.Errorf("parseNode(%q) = %+v, %v; want %+v", name, got, ok, want)
		}
	}
	for _, name := range []string{"lock-1", "x-lock-0000000001", "_c_x-lock-00000000a1", "_c_x-lock-00000000001", "readme",
		"_c_x-sem-0-0000000001", "_c_x-sem-03-0000000001", "_c_x-sem-1048577-0000000001", "_c_x-sem--0000000001",
		"_c_x-sem-3x-0000000001", "_c_x-sem-99999999999-0000000001", "_c_x-write-0000000001", "x-read-0000000001"} {
		if n, ok := parseNode(name); ok {
			t.Errorf("parseNode(%q) = %+v, want not a queue node", name, n)
		}
	}
	q := queueOf([]string{"_c_b-lock-0000000010", "junk", "_c_a-lock-0000000002", "lock-0000000005"})
	if len(q) != 3 || q[0].owner != "a" || q[1].seq != 5 || q[2].owner != "b" {
		t.Fatalf("queueOf = %+v", q)
	}
	for _, m := range []struct {
		mode  driver.Mode
		limit int
	}{{driver.Exclusive, 0}, {driver.Shared, 0}, {driver.Limited, 1}, {driver.Limited, 77}} {
		n, ok := parseNode(nodePrefix("0123abcd", m.mode, m.limit) + "0000000042")
		if !ok || n.owner != "0123abcd" || n.mode != m.mode || n.limit != m.limit || n.seq != 42 {
			t.Errorf("nodePrefix(%v, %d) does not parse back: %+v, %v", m.mode, m.limit, n, ok)
		}
	}
}

func TestValidPrefix(t *testing.T) {
	for _, p := range []string{"/", "/dlock", "/a/b/c", "/app-1/locks", "/a%2Fb"} {
		if !validPrefix(p) {
			t.Errorf("validPrefix(%q) = false", p)
		}
	}
	for _, p := range []string{"", "dlock", "/a/", "/a//b", "/./a", "/a/..", "/a\x00b", "/a\x01", "/😀"} {
		if validPrefix(p) {
			t.Errorf("validPrefix(%q) = true", p)
		}
	}
}

// FuzzEscapeKey: every valid key escapes to one legal znode name that
// unescapes to the key, and distinct keys never share a name.
func FuzzEscapeKey(f *testing.F) {
	for _, s := range []string{"a", "a/b", "%", ".", "..", "zookeeper", "x\x7f", "😀", "\uffff", "\u0085"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		if key == "" || !utf8.ValidString(key) || strings.ContainsRune(key, 0) {
			return
		}
		name := EscapeKey(key)
		if strings.Contains(name, "/") || name == "." || name == ".." || name == "zookeeper" || name == "" {
			t.Fatalf("EscapeKey(%q) = %q: not a legal znode name", key, name)
		}
		for i := 0; i < len(name); {
			r, w := utf8.DecodeRuneInString(name[i:])
			if !plain(r, w) && r != '%' {
				t.Fatalf("EscapeKey(%q) = %q keeps %U, which ZooKeeper refuses", key, name, r)
			}
			i += w
		}
		if !validPrefix("/" + name) {
			t.Fatalf("EscapeKey(%q) = %q is not a valid path segment", key, name)
		}
		back, ok := unescapeKey(name)
		if !ok || back != key {
			t.Fatalf("unescapeKey(%q) = %q, %v; want %q", name, back, ok, key)
		}
	})
}

// parseNode never panics, and what it accepts it parses consistently: a
// node it reads as limited has a limit in range, and the name rebuilt
// from its fields parses to the same node.
func FuzzParseNode(f *testing.F) {
	for _, s := range []string{"_c_ab-lock-0000000001", "read-0000000002", "_c_ab-sem-12-0000000003", "sem--0000000004", "_c_-sem-0-0000000005", "0000000000"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		n, ok := parseNode(name)
		if !ok {
			return
		}
		if n.mode == driver.Limited && (n.limit < 1 || n.limit > 1<<20) {
			t.Fatalf("parseNode(%q) limit %d", name, n.limit)
		}
		if n.owner != "" {
			again, ok := parseNode(nodePrefix(n.owner, n.mode, n.limit) + name[len(name)-seqDigits:])
			if !ok || again.owner != n.owner || again.mode != n.mode || again.limit != n.limit || again.seq != n.seq {
				t.Fatalf("parseNode(%q) = %+v, rebuilt %+v, %v", name, n, again, ok)
			}
		}
	})
}
