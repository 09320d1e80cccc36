package testserver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The module's source is found from anywhere inside a checkout (a
// package's directory, where go test runs) as ../shared/tairstring beside
// it; a checkout without it gets an error naming the folder it wants.
func TestTairStringSource_BesideTheCheckout(t *testing.T) {
	root := t.TempDir()
	checkout := filepath.Join(root, "dlock")
	pkg := filepath.Join(checkout, "redislock", "redisproto")
	if err := os.MkdirAll(pkg, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(checkout, "go.work"), []byte("go 1.26\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := tairStringSourceFrom(pkg); err == nil || !strings.Contains(err.Error(), filepath.Join("shared", "tairstring", "build.sh")) {
		t.Fatalf("without the folder: %v; want an error naming shared/tairstring/build.sh", err)
	}
	src := filepath.Join(root, "shared", "tairstring")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "build.sh"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := tairStringSourceFrom(pkg)
	if err != nil || filepath.Clean(got) != src {
		t.Fatalf("with the folder: %q, %v; want %q", got, err, src)
	}
	if _, err := tairStringSourceFrom(root); err == nil {
		t.Fatal("outside a checkout: no error")
	}
}
