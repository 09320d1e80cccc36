package redisproto

import (
	"encoding/json"
	"testing"
)

// EncodeMetadata writes what json.Marshal writes, for every map: the
// values stored before it existed and after read alike (ParseValue).
func FuzzEncodeMetadata_MatchesJSONMarshal(f *testing.F) {
	f.Add("host", "web-1", "pid", "4242", "acquired", "1764460800000")
	f.Add("", "", "k", "v", "k2", "")
	f.Add("a\"b", "c\\d", "<tag>", "x&y", "é", "\u2028")
	f.Add("ctl\x01", "tab\t", "nul\x00", "del\x7f", "bad\xff", "ok")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, k3, v3 string) {
		for _, md := range []map[string]string{nil, {}, {k1: v1}, {k1: v1, k2: v2, k3: v3}} {
			got, err := EncodeMetadata(md)
			want, werr := json.Marshal(md)
			if err != nil || werr != nil {
				t.Fatalf("EncodeMetadata(%q): %v; json.Marshal: %v", md, err, werr)
			}
			if got != string(want) {
				t.Fatalf("EncodeMetadata(%q) = %s, json.Marshal gives %s", md, got, want)
			}
		}
	})
}
