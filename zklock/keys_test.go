package zklock

import (
	"strings"
	"testing"
	"unicode/utf8"
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
	} {
		got, ok := parseNode(name)
		want.name = name
		if !ok || got != want {
			t.Errorf("parseNode(%q) = %+v, %v; want %+v", name, got, ok, want)
		}
	}
	for _, name := range []string{"lock-1", "x-lock-0000000001", "_c_x-lock-00000000a1", "_c_x-lock-00000000001", "readme"} {
		if n, ok := parseNode(name); ok {
			t.Errorf("parseNode(%q) = %+v, want not a queue node", name, n)
		}
	}
	q := queueOf([]string{"_c_b-lock-0000000010", "junk", "_c_a-lock-0000000002", "lock-0000000005"})
	if len(q) != 3 || q[0].owner != "a" || q[1].seq != 5 || q[2].owner != "b" {
		t.Fatalf("queueOf = %+v", q)
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
