package background

import (
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Work starting from zero while Wait runs must not race with Wait (a
// sync.WaitGroup Add from zero concurrent with its Wait is a data race).
// The spawner is known to be running before each Wait starts, so every
// round overlaps a Go with a Wait, whatever the scheduler does.
func TestStartDuringWait_NoRace(t *testing.T) {
	var ran atomic.Int32
	for i := 0; i < 200; i++ {
		stop := make(chan struct{})
		spawning := make(chan struct{})
		exited := make(chan struct{})
		go func() {
			defer close(exited)
			for n := 0; ; n++ {
				Go(func() { ran.Add(1) })
				if n == 0 {
					close(spawning)
				}
				select {
				case <-stop:
					return
				default:
				}
			}
		}()
		<-spawning
		Wait(time.Millisecond)
		close(stop)
		<-exited
	}
	if !Wait(10 * time.Second) {
		t.Fatal("background work did not end")
	}
	if got := ran.Load(); got < 200 {
		t.Fatalf("%d pieces of work ran, want at least one per round (200)", got)
	}
}

func TestWaitTimesOut(t *testing.T) {
	release := make(chan struct{})
	Go(func() { <-release })
	if Wait(10 * time.Millisecond) {
		t.Fatal("Wait reported idle while work runs")
	}
	close(release)
	if !Wait(10 * time.Second) {
		t.Fatal("Wait: work did not end")
	}
}

func TestFlushRunsPendingNow(t *testing.T) {
	var ran atomic.Bool
	AfterFunc(time.Hour, func() { ran.Store(true) })
	Flush()
	if !Wait(10*time.Second) || !ran.Load() {
		t.Fatal("Flush did not run the pending work")
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
