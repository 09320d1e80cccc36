package zklock

import (
	"testing"

	"github.com/dlock-go/dlock/driver"
)

// The recipe's decisions on queues of mixed modes, written as one letter
// per node: W exclusive, R shared, a digit a permit of that limit.
func TestRecipeRules(t *testing.T) {
	parse := func(s string) []qnode {
		q := make([]qnode, len(s))
		for i, c := range s {
			q[i] = qnode{name: string(rune('a' + i)), seq: int64(i)}
			switch {
			case c == 'W':
			case c == 'R':
				q[i].mode = driver.Shared
			default:
				q[i].mode, q[i].limit = driver.Limited, int(c-'0')
			}
		}
		return q
	}
	for _, c := range []struct {
		queue    string
		admitted string // per node: + admitted, - waiting
		holders  int
		blockers []int // per node: blocker's index
	}{
		{"W", "+", 1, []int{-1}},
		{"WW", "+-", 1, []int{-1, 0}},
		{"RRR", "+++", 3, []int{-1, -1, -1}},
		{"RRWR", "++--", 2, []int{-1, -1, 1, 2}},
		{"WRRW", "+---", 1, []int{-1, 0, 0, 2}},
		{"222", "++-", 2, []int{-1, -1, -1}},
		{"2232", "++--", 2, []int{-1, -1, 1, 2}},
		{"3222", "+---", 1, []int{-1, 0, 0, 0}},
		{"R2R", "+--", 1, []int{-1, 0, 1}},
		{"1W1", "+--", 1, []int{-1, 0, 1}},
		{"", "", 0, nil},
	} {
		q := parse(c.queue)
		if got := len(holdersOf(q)); got != c.holders {
			t.Errorf("%s: %d holders, want %d", c.queue, got, c.holders)
		}
		for i := range q {
			if got := admitted(q, i); got != (c.admitted[i] == '+') {
				t.Errorf("%s: node %d admitted = %v", c.queue, i, got)
			}
			if got := blocker(q, i); got != c.blockers[i] {
				t.Errorf("%s: node %d blocker %d, want %d", c.queue, i, got, c.blockers[i])
			}
		}
	}
}
