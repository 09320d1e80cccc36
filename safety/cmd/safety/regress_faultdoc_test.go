package main

import "testing"

// The matrix's Faults section listed clock-jump and kill-leader with an
// empty description: every fault a case injects needs its faultDoc entry.
func TestRegressEveryFaultDocumented(t *testing.T) {
	for _, c := range append(allCases(), quickCases()...) {
		if faultDoc[c.fault] == "" {
			t.Errorf("%s: fault %q has no faultDoc entry (the matrix would describe it as empty)", c.name(), c.fault)
		}
	}
}
