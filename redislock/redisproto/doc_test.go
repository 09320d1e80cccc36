package redisproto_test

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/redislock/redisproto"
)

// The layout table in the package documentation names exactly the keys
// and channels the code builds, under the current ProtocolVersion.
func TestDocLayoutMatchesCode(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	heading := fmt.Sprintf("// # Layout, version %d\n", redisproto.ProtocolVersion)
	start := strings.Index(doc, heading)
	end := strings.Index(doc, "// The lock value is one of")
	if start < 0 || end < start {
		t.Fatalf("doc.go has no %q followed by the lock values", heading)
	}
	row := regexp.MustCompile(`(?m)^//\tP:\{T\}(\S*)`)
	var documented []string
	for _, m := range row.FindAllStringSubmatch(doc[start:end], -1) {
		if m[1] != "" {
			documented = append(documented, strings.TrimSuffix(m[1], "<id>"))
		}
	}
	code := slices.Clone(redisproto.Suffixes)
	slices.Sort(documented)
	slices.Sort(code)
	if !slices.Equal(documented, code) {
		t.Fatalf("the layout table documents suffixes %q; the code builds %q", documented, code)
	}
}
