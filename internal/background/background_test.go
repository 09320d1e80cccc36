package background

import (
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Work starting while a test waits (a timer firing, a lock lost) used to be
// a sync.WaitGroup Add from zero concurrent with its Wait: the race
// detector reported it in CI (redislock TestRegressDepartedWaitersStayQueued).
func TestRegressStartDuringWait(t *testing.T) {
	var ran atomic.Int32
	for i := 0; i < 200; i++ {
		stop := make(chan struct{})
		go func() {
			for {
				select {
				case <-stop:
					return
				default:
					Go(func() { ran.Add(1) })
				}
			}
		}()
		Wait(time.Millisecond)
		close(stop)
	}
	if !Wait(10 * time.Second) {
		t.Fatal("background work did not end")
	}
	if ran.Load() == 0 {
		t.Fatal("no work ran")
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
