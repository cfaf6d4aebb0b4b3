package proof

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemguard/idemguard/guard"
)

// hist builds a history from (call, return) pairs in order.
type hist struct{ ops []porcupine.Operation }

var mk = guard.Key{Scope: "s", ID: "k"}

func (h *hist) add(client int, call, ret int64, in Input, out Output) {
	in.Key = mk
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
}

func claim(tok string) Input { return Input{Op: OpClaim, Token: tok, Fingerprint: "fp"} }
func acquired(fence int64, att int, rcv bool) Output {
	return Output{Status: guard.Acquired, Fence: fence, Attempt: att, Recovered: rcv}
}

func check(t *testing.T, h *hist) porcupine.CheckResult {
	t.Helper()
	res, path, err := Check(h.ops, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if res != porcupine.Ok {
		if path == "" {
			t.Fatal("no visualisation written for a failed check")
		}
		b, err := os.ReadFile(path)
		if err != nil || !strings.Contains(string(b), "<html") {
			t.Fatalf("visualisation %s unreadable: %v", path, err)
		}
		_ = os.Remove(path)
	}
	return res
}

func TestModelAcceptsCorrectHistories(t *testing.T) {
	var h hist
	h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
	h.add(1, 2, 3, claim("B"), Output{Status: guard.InProgress})
	h.add(0, 4, 5, Input{Op: OpComplete, Token: "A", Value: "r"}, Output{OK: true})
	h.add(1, 6, 7, claim("B"), Output{Status: guard.Replay, Result: "r"})
	h.add(1, 6, 7, Input{Op: OpClaim, Token: "C", Fingerprint: "other"}, Output{Status: guard.Mismatch})
	if res := check(t, &h); res != porcupine.Ok {
		t.Fatalf("sequential history: %s, want ok", res)
	}

	// A lease runs out: B recovers, A's late complete is lost.
	h = hist{}
	h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
	h.add(1, 2, 3, claim("B"), acquired(2, 2, true))
	h.add(0, 4, 5, Input{Op: OpComplete, Token: "A", Value: "a"}, Output{OK: false})
	h.add(1, 4, 6, Input{Op: OpComplete, Token: "B", Value: "b"}, Output{OK: true})
	h.add(2, 7, 8, Input{Op: OpGet}, Output{Found: true, Record: Snapshot{State: guard.StateCompleted, Token: "B", Fingerprint: "fp", Fence: 2, Attempt: 2, Recovered: true, Result: "b"}})
	if res := check(t, &h); res != porcupine.Ok {
		t.Fatalf("recovery history: %s, want ok", res)
	}

	// A claim whose reply was lost may have taken the key: a later
	// recovery at fence 2 is explained by it.
	h = hist{}
	h.add(0, 0, 100, claim("A"), Output{Unknown: true, Err: "unavailable"})
	h.add(1, 2, 3, claim("B"), acquired(2, 2, true))
	if res := check(t, &h); res != porcupine.Ok {
		t.Fatalf("unknown claim history: %s, want ok", res)
	}

	// Release of a first attempt frees the key (a first attempt again, at
	// the next fence); a later one leaves it failed.
	h = hist{}
	h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
	h.add(0, 2, 3, Input{Op: OpRelease, Token: "A"}, Output{OK: true})
	h.add(1, 4, 5, claim("B"), acquired(2, 1, false))
	h.add(1, 6, 7, Input{Op: OpFail, Token: "B", Value: "x"}, Output{OK: true})
	h.add(0, 8, 9, claim("C"), acquired(3, 2, false))
	h.add(0, 10, 11, Input{Op: OpRelease, Token: "C"}, Output{OK: true})
	h.add(1, 12, 13, Input{Op: OpGet}, Output{Found: true, Record: Snapshot{State: guard.StateFailed, Token: "C", Fingerprint: "fp", Fence: 3, Attempt: 1, LastError: "x"}})
	if res := check(t, &h); res != porcupine.Ok {
		t.Fatalf("release history: %s, want ok", res)
	}

	// A fail whose reply was lost and re-sent by go-redis: its first copy
	// failed the key, two more holders came and went, and the re-sent
	// copy found neither its token nor its ptok: LOST, though it took
	// effect (seen by the nemesis; docs/design.md, rule 2). The answer a
	// fail gets when nothing is re-sent is pinned by guard/storetest.
	h = hist{}
	h.add(0, 0, 10, claim("A"), acquired(1, 1, false))
	h.add(0, 11, 80, Input{Op: OpFail, Token: "A", Value: "x"}, Output{OK: false})
	h.add(1, 30, 35, claim("B"), acquired(2, 2, false))
	h.add(1, 36, 37, Input{Op: OpFail, Token: "B", Value: "x"}, Output{OK: true})
	h.add(2, 50, 55, claim("C"), acquired(3, 3, false))
	h.add(2, 60, 65, Input{Op: OpComplete, Token: "C", Value: "c"}, Output{OK: true})
	if res := check(t, &h); res != porcupine.Ok {
		t.Fatalf("re-sent fail history: %s, want ok", res)
	}

	// A claim at its limit (4) finds the lease of attempt 4 run out: it
	// records the attempt failed ("lease expired") and answers EXHAUSTED,
	// but that reply is lost; C, with a limit of 6, takes the failed key
	// (not recovered: the record says failed); the copy go-redis re-sent
	// meets C: IN_PROGRESS (seen by the soak, seed 30).
	h = hist{}
	exhaustAt := func(tok string, max int) Input { in := claim(tok); in.MaxAttempts = max; return in }
	h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
	h.add(0, 2, 3, Input{Op: OpFail, Token: "A", Value: "x"}, Output{OK: true})
	h.add(0, 4, 5, claim("A2"), acquired(2, 2, false))
	h.add(0, 6, 7, Input{Op: OpFail, Token: "A2", Value: "x"}, Output{OK: true})
	h.add(0, 8, 9, claim("A3"), acquired(3, 3, false))
	h.add(0, 10, 11, Input{Op: OpFail, Token: "A3", Value: "x"}, Output{OK: true})
	h.add(0, 12, 13, claim("A4"), acquired(4, 4, false)) // abandoned: its lease runs out
	h.add(1, 20, 60, exhaustAt("B", 4), Output{Status: guard.InProgress})
	h.add(2, 21, 61, exhaustAt("C", 6), acquired(5, 5, false))
	if res := check(t, &h); res != porcupine.Ok {
		t.Fatalf("re-sent exhausting claim history: %s, want ok", res)
	}
}

// The checker must be able to fail: each history here is one of the bugs
// the field shipped, and the model rejects it.
func TestModelRejectsKnownBugs(t *testing.T) {
	cases := map[string]func(h *hist){
		// Powertools 5714: a late complete overwrites after a recovery.
		"late complete after recovery succeeds": func(h *hist) {
			h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
			h.add(1, 2, 3, claim("B"), acquired(2, 2, true))
			h.add(0, 4, 5, Input{Op: OpComplete, Token: "A", Value: "a"}, Output{OK: true})
		},
		// Two completions: a claim after a completion runs again.
		"claim after completion acquires": func(h *hist) {
			h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
			h.add(0, 2, 3, Input{Op: OpComplete, Token: "A", Value: "a"}, Output{OK: true})
			h.add(1, 4, 5, claim("B"), acquired(2, 2, true))
		},
		// Powertools 5675: a rejected duplicate releases the original.
		"rejected duplicate releases the original": func(h *hist) {
			h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
			h.add(1, 2, 3, claim("B"), Output{Status: guard.InProgress})
			h.add(1, 4, 5, Input{Op: OpRelease, Token: "B"}, Output{OK: true})
		},
		// A replay of a result nobody stored.
		"replay of another result": func(h *hist) {
			h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
			h.add(0, 2, 3, Input{Op: OpComplete, Token: "A", Value: "a"}, Output{OK: true})
			h.add(1, 4, 5, claim("B"), Output{Status: guard.Replay, Result: "b"})
		},
		// A retried claim that answers with a new fence.
		"retried claim moves the fence": func(h *hist) {
			h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
			h.add(0, 2, 3, claim("A"), acquired(2, 2, false))
		},
		// A fail that reports OK though another holder had the key.
		"stale fail ok": func(h *hist) {
			h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
			h.add(1, 2, 3, claim("B"), acquired(2, 2, true))
			h.add(0, 4, 5, Input{Op: OpFail, Token: "A", Value: "x"}, Output{OK: true})
		},
		// The same taken over without a claim at its limit in between:
		// the dead holder's successor must be told it recovered the key.
		"takeover of a dead holder not recovered": func(h *hist) {
			h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
			h.add(1, 2, 3, claim("B"), Output{Status: guard.InProgress})
			h.add(2, 4, 5, claim("C"), acquired(2, 2, false))
		},
		// A copy of a claim that lands after its holder failed it takes
		// the key again (rule 2: it takes nothing).
		"claim copy after its fail acquires": func(h *hist) {
			h.add(0, 0, 1, claim("A"), acquired(1, 1, false))
			h.add(0, 2, 3, Input{Op: OpFail, Token: "A", Value: "x"}, Output{OK: true})
			h.add(0, 4, 5, claim("A"), acquired(2, 2, false))
		},
		"corrupt reply": func(h *hist) {
			h.add(0, 0, 1, claim("A"), Output{Bad: true, Err: "corrupt"})
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
