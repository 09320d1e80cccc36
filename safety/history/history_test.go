package history_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/safety/history"
)

func TestWriteReadRoundTrip(t *testing.T) {
	p := filepath.Join(t.TempDir(), "w.log")
	w, err := history.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	in := []history.Event{
		{Worker: 1, Key: "k", Op: history.OpAcquire, Result: history.OK, Token: 7, T0: 1, T1: 2},
		{Worker: 1, Key: "k", Op: history.OpWrite, Register: history.Fenced, Token: 7, Value: 3, Result: history.Rejected, T0: 3, T1: 4, Err: "stale"},
	}
	for _, e := range in {
		if err := w.Write(e); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	out, err := history.ReadFiles(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 || out[0] != in[0] || out[1] != in[1] {
		t.Fatalf("read %+v, want %+v", out, in)
	}
}

// A process killed mid-write leaves a torn last line: skipped. A bad line
// elsewhere is an error.
func TestReadTornLastLine(t *testing.T) {
	ev, err := history.Read(strings.NewReader(`{"w":1,"op":"acquire","t0":1}` + "\n" + `{"w":1,"op":"rea`))
	if err != nil || len(ev) != 1 {
		t.Fatalf("torn last line: %v %v", ev, err)
	}
	if _, err := history.Read(strings.NewReader(`{"w":1,"op":"rea` + "\n" + `{"w":1,"op":"acquire","t0":1}` + "\n")); err == nil {
		t.Fatal("a bad line in the middle was accepted")
	}
}

func TestNowIsMonotonic(t *testing.T) {
	a := history.Now()
	b := history.Now()
	if a <= 0 || b < a {
		t.Fatalf("Now: %d then %d", a, b)
	}
}
