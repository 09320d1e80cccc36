package dlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

func TestBackoffBounds(t *testing.T) {
	b := dlock.ExpBackoff{Min: 4 * time.Millisecond, Max: 64 * time.Millisecond}
	for attempt := 1; attempt < 40; attempt++ {
		for i := 0; i < 50; i++ {
			d := b.Next(attempt)
			want := 4 * time.Millisecond << min(attempt-1, 4)
			if d < want/2 || d > want {
				t.Fatalf("attempt %d: %v not in [%v, %v]", attempt, d, want/2, want)
			}
		}
	}
	c := dlock.ConstBackoff{Delay: 10 * time.Millisecond, Jitter: 2 * time.Millisecond}
	for i := 0; i < 100; i++ {
		if d := c.Next(i); d < 8*time.Millisecond || d > 12*time.Millisecond {
			t.Fatalf("const backoff %v", d)
		}
	}
}

// ExpBackoff and ConstBackoff saturate rather than overflow with huge
// bounds or jitter.
// Symptom: their arithmetic panicked with large values.
func TestBackoff_HugeValuesDoNotOverflow(t *testing.T) {
	try := func(name string, f func()) {
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("PANIC in %s: %v", name, r)
			}
		}()
		f()
	}
	try("ExpBackoff{Min: 1<<62, Max: 1<<63-1}.Next(2)", func() {
		dlock.ExpBackoff{Min: 1 << 62, Max: 1<<63 - 1}.Next(2)
	})
	try("ExpBackoff{Min: 1h, Max: 1<<63-1}.Next(50)", func() {
		dlock.ExpBackoff{Min: time.Hour, Max: 1<<63 - 1}.Next(50)
	})
	try("ConstBackoff{Jitter: 1<<62}.Next(1)", func() {
		dlock.ConstBackoff{Delay: time.Second, Jitter: 1 << 62}.Next(1)
	})
}

// A waiting Acquire with a huge-jitter Backoff does not panic on the
// caller's goroutine after the key was seen held.
// Symptom: the Backoff's overflow panicked inside Acquire.
func TestAcquire_HugeJitterBackoffDoesNotPanic(t *testing.T) {
	m := memlock.New()
	lk, err := m.TryAcquire(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("PANIC from Acquire with WithBackoff(ConstBackoff{Delay:1ms, Jitter:1<<62}): %v", r)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = m.Acquire(ctx, "k", dlock.WithBackoff(dlock.ConstBackoff{Delay: time.Millisecond, Jitter: 1 << 62}))
	t.Logf("Acquire: %v", err)
}
