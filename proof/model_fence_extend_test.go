package proof

import (
	"testing"

	"github.com/anishathalye/porcupine"

	"github.com/idemguard/idemguard/guard"
)

// TestModelRejectsFenceAndExtendBugs: histories only a store breaking
// rule 4 (fences only grow) or extending a lease it no longer holds can
// give. Each differs from a legal history in the fence alone, or in an
// extension's answer alone, so a model that stops comparing either passes
// the store bug.
func TestModelRejectsFenceAndExtendBugs(t *testing.T) {
	cases := map[string]func(h *hist){
		"takeover of a failed key keeps the fence": func(h *hist) {
			h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
			h.add(0, 2, 3, Input{Op: OpFail, Token: "A", Value: "x"}, Output{OK: true})
			h.add(1, 4, 5, claim("B"), acquired(1, 2, false))
		},
		"a first attempt after a released one keeps the fence": func(h *hist) {
			h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
			h.add(0, 2, 3, Input{Op: OpRelease, Token: "A"}, Output{OK: true})
			h.add(1, 4, 5, claim("B"), acquired(1, 1, false))
		},
		"recovery keeps the fence": func(h *hist) {
			h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
			h.add(1, 2, 3, claim("B"), acquired(1, 2, true))
		},
		"extension of a failed record": func(h *hist) {
			h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
			h.add(0, 2, 3, Input{Op: OpFail, Token: "A", Value: "x"}, Output{OK: true})
			h.add(0, 4, 5, Input{Op: OpExtend, Token: "A"}, Output{OK: true})
		},
		"extension after an exhausted claim failed the lease": func(h *hist) {
			in := claim("B")
			in.MaxAttempts = 1
			h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
			h.add(1, 2, 3, in, Output{Status: guard.Exhausted, Attempt: 1, LastError: "lease expired"})
			h.add(0, 4, 5, Input{Op: OpExtend, Token: "A"}, Output{OK: true})
		},
	}
	for name, build := range cases {
		t.Run(name, func(t *testing.T) {
			var h hist
			build(&h)
			if res := check(t, &h); res != porcupine.Illegal {
				t.Fatalf("got %s, want illegal", res)
			}
		})
	}
	// The same histories with the right answers are legal: the cases
	// above fail for the one thing they change.
	var h hist
	h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
	h.add(0, 2, 3, Input{Op: OpExtend, Token: "A"}, Output{OK: true})
	h.add(0, 4, 5, Input{Op: OpFail, Token: "A", Value: "x"}, Output{OK: true})
	h.add(0, 6, 7, Input{Op: OpExtend, Token: "A"}, Output{OK: false})
	h.add(1, 8, 9, claim("B"), acquired(2, 2, false))
	if res := check(t, &h); res != porcupine.Ok {
		t.Fatalf("legal history: %s, want ok", res)
	}
}
