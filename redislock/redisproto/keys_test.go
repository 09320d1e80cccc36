package redisproto_test

import (
	"strings"
	"testing"

	"github.com/dlock-go/dlock/redislock/redisproto"
)

// Every encoded key has a non-empty hash tag, and the encoding is
// injective and reversible; keys not starting with '}' are unchanged.
func TestHashTag(t *testing.T) {
	t.Parallel()
	seen := map[string]string{}
	for _, k := range []string{"}", "}x", "}}", "{", "{}", "{a}", "a}b{c", "x", "\x01}", " }", "}{", "日本"} {
		enc := redisproto.HashTag(k)
		if redisproto.DecodeHashTag(enc) != k {
			t.Errorf("%q: decodes to %q", k, redisproto.DecodeHashTag(enc))
		}
		if k[0] != '}' && enc != k {
			t.Errorf("%q: encoded as %q, want unchanged", k, enc)
		}
		full := "dlock:{" + enc + "}"
		open := strings.IndexByte(full, '{')
		if end := strings.IndexByte(full[open+1:], '}'); end <= 0 {
			t.Errorf("%q: empty hash tag in %q", k, full)
		}
		if prev, dup := seen[enc]; dup {
			t.Errorf("%q and %q encode alike", k, prev)
		}
		seen[enc] = k
	}
}
