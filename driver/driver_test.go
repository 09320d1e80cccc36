package driver_test

import (
	"testing"

	"github.com/dlock-go/dlock/driver"
)

type a struct{ n int }
type b struct{ s string }

func TestApplyPicksItsOwnSettings(t *testing.T) {
	opts := []driver.Option{
		driver.Setting(func(x *a) { x.n = 7 }),
		nil,
		driver.Setting(func(x *b) { x.s = "b" }),
		driver.Setting[a](nil),
	}
	var x a
	var y b
	driver.Apply(&x, opts)
	driver.Apply(&y, opts)
	if x.n != 7 || y.s != "b" {
		t.Fatalf("got %+v %+v", x, y)
	}
}

func TestModeString(t *testing.T) {
	for m, want := range map[driver.Mode]string{driver.Exclusive: "exclusive", driver.Shared: "shared", driver.Limited: "limited", 9: "mode(9)"} {
		if got := m.String(); got != want {
			t.Errorf("%d: %q, want %q", m, got, want)
		}
	}
}
