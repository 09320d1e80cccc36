package dlock

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A watchdog whose timer fires late (thousands of locks under -race on 2
// cores) left Lost() open past the local deadline: a redislock scale test
// (6000 locks sharing a deadline) saw a contender granted a key 56ms after
// its holder's deadline while the holder's Lost() was still open. Lost()
// and Err() now lose a lock whose deadline passed themselves. The test
// moves the clock past the deadline without firing the timer, to stand
// for one that fires late.
func TestRegressLostAfterDeadlineWithStarvedWatchdog(t *testing.T) {
	for _, look := range []string{"Lost", "Err"} {
		t.Run(look, func(t *testing.T) {
			a, fc := fakeEngine(&countingBackend{})
			lk, err := a.TryAcquire(context.Background(), "k", WithTTL(MinTTL), WithAutoRefresh(false))
			if err != nil {
				t.Fatal(err)
			}
			fc.Spend(lk.Deadline().Sub(fc.Now()) + time.Millisecond)
			var lost bool
			if look == "Lost" {
				select {
				case <-lk.Lost():
					lost = true
				default:
				}
			}
			err = lk.Err()
			var le *LostError
			if !errors.As(err, &le) || le.Reason != LossDeadline {
				t.Fatalf("Err() after the deadline with the watchdog's timer stopped: %v, want a *LostError (deadline)", err)
			}
			if look == "Lost" && !lost {
				t.Fatal("Lost() open after the deadline with the watchdog's timer stopped")
			}
			select {
			case <-lk.Lost():
			default:
				t.Fatal("Lost() open after Err() reported the loss")
			}
		})
	}
}
