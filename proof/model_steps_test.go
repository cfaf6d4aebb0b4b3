package proof

import (
	"testing"

	"github.com/anishathalye/porcupine"

	"github.com/idemguard/idemguard/guard"
)

func stepIn(tok string, i int, name, v string) Input {
	return Input{Op: OpStep, Token: tok, Index: i, Name: name, Value: v}
}

func withSteps(o Output, lines ...string) Output {
	for _, l := range lines {
		o.Steps += l
	}
	return o
}

func TestModelAcceptsStepHistories(t *testing.T) {
	a1, b1 := stepLine("a", "1"), stepLine("b", "1")
	var h hist
	// A records a (sent again: OK, A still holds the key); fails; B
	// resumes seeing a, records b; A, a stale writer, is LOST whatever it
	// sends, its own step a included; B completes, steps go.
	h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
	h.add(0, 2, 3, stepIn("A", 0, "a", "1"), Output{OK: true})
	h.add(0, 4, 5, stepIn("A", 0, "a", "1"), Output{OK: true})
	h.add(0, 6, 7, Input{Op: OpFail, Token: "A", Value: "x"}, Output{OK: true})
	h.add(1, 8, 9, claim("B"), withSteps(acquired(2, 2, false), a1))
	h.add(1, 10, 11, stepIn("B", 1, "b", "1"), Output{OK: true})
	h.add(0, 12, 13, stepIn("A", 1, "b", "A"), Output{OK: false})
	h.add(0, 12, 13, stepIn("A", 0, "a", "1"), Output{OK: false})
	h.add(1, 14, 15, stepIn("B", 1, "x", "1"), Output{Order: true})
	h.add(1, 14, 15, stepIn("B", 3, "x", "1"), Output{Order: true})
	h.add(2, 16, 17, Input{Op: OpGet}, Output{Found: true, Record: Snapshot{State: guard.StatePending, Token: "B",
		Fingerprint: "fp", Fence: 2, Attempt: 2, LastError: "x", Steps: a1 + b1}})
	h.add(1, 18, 19, Input{Op: OpComplete, Token: "B", Value: "r"}, Output{OK: true})
	h.add(2, 20, 21, Input{Op: OpGet}, Output{Found: true, Record: Snapshot{State: guard.StateCompleted, Token: "B",
		Fingerprint: "fp", Fence: 2, Attempt: 2, LastError: "x", Result: "r"}})
	if res := check(t, &h); res != porcupine.Ok {
		t.Fatalf("step history: %s, want ok", res)
	}

	// A step whose reply was lost may have been stored: the recovering
	// claim may or may not see it.
	for _, seen := range []bool{true, false} {
		h = hist{}
		h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
		h.add(0, 2, 100, stepIn("A", 0, "a", "1"), Output{Unknown: true, Err: "unavailable"})
		out := acquired(2, 2, true)
		if seen {
			out = withSteps(out, a1)
		}
		h.add(1, 3, 4, claim("B"), out)
		if res := check(t, &h); res != porcupine.Ok {
			t.Fatalf("unknown step, seen %t: %s, want ok", seen, res)
		}
	}

	// A release of a first attempt with steps leaves it failed.
	h = hist{}
	h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
	h.add(0, 2, 3, stepIn("A", 0, "a", "1"), Output{OK: true})
	h.add(0, 4, 5, Input{Op: OpRelease, Token: "A"}, Output{OK: true})
	h.add(1, 6, 7, claim("B"), withSteps(acquired(2, 2, false), a1))
	if res := check(t, &h); res != porcupine.Ok {
		t.Fatalf("release with steps: %s, want ok", res)
	}
}

// The model must reject histories where a step's result changed, a stale
// holder stored one, or steps were forgotten or kept where they must not.
func TestModelRejectsStepBugs(t *testing.T) {
	a1 := stepLine("a", "1")
	cases := map[string]func(h *hist){
		"a stored step changes": func(h *hist) {
			h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
			h.add(0, 2, 3, stepIn("A", 0, "a", "1"), Output{OK: true})
			h.add(0, 4, 5, Input{Op: OpFail, Token: "A", Value: "x"}, Output{OK: true})
			h.add(1, 6, 7, claim("B"), withSteps(acquired(2, 2, false), stepLine("a", "2")))
		},
		"a recovery forgets a step": func(h *hist) {
			h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
			h.add(0, 2, 3, stepIn("A", 0, "a", "1"), Output{OK: true})
			h.add(1, 4, 5, claim("B"), acquired(2, 2, true))
		},
		"a stale holder stores a step": func(h *hist) {
			h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
			h.add(1, 2, 3, claim("B"), acquired(2, 2, true))
			h.add(0, 4, 5, stepIn("A", 0, "a", "1"), Output{OK: true})
		},
		"a step after another at the same index": func(h *hist) {
			h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
			h.add(0, 2, 3, stepIn("A", 0, "a", "1"), Output{OK: true})
			h.add(0, 4, 5, stepIn("A", 0, "b", "1"), Output{OK: true})
		},
		"a release with steps frees the key": func(h *hist) {
			h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
			h.add(0, 2, 3, stepIn("A", 0, "a", "1"), Output{OK: true})
			h.add(0, 4, 5, Input{Op: OpRelease, Token: "A"}, Output{OK: true})
			h.add(1, 6, 7, claim("B"), acquired(1, 1, false))
		},
		"completion keeps steps": func(h *hist) {
			h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
			h.add(0, 2, 3, stepIn("A", 0, "a", "1"), Output{OK: true})
			h.add(0, 4, 5, Input{Op: OpComplete, Token: "A", Value: "r"}, Output{OK: true})
			h.add(1, 6, 7, Input{Op: OpGet}, Output{Found: true, Record: Snapshot{State: guard.StateCompleted, Token: "A",
				Fingerprint: "fp", Fence: 1, Attempt: 1, Result: "r", Steps: a1}})
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
}
