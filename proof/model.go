package proof

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemguard/idemguard/guard"
)

// The model is the per-key state machine of docs/design.md ("The state machine"), as the scripts
// implement it:
//
//	absent ──claim──▶ pending(token, fence, attempt) ──complete(token)──▶ completed(result)
//	pending ──fail(token)──▶ failed ──claim──▶ pending(fence+1, attempt+1)
//	pending ──claim by another, lease expired──▶ pending(fence+1, attempt+1, recovered)
//	pending ──release(token)──▶ absent, keeping the fence (first attempt), or failed (attempt uncounted)
//	pending ──step(token, index)──▶ pending with the step appended (steps.go)
//
// Steps stay through failures, recoveries and releases (a release of a
// record with steps leaves it failed) and go on completion; a step's
// result, once stored, never changes, and every acquiring claim reports
// the steps as stored.
//
// Whether a lease has run out is a matter of time, which the model does not
// see: a claim that meets another holder's pending record may either get
// IN_PROGRESS or recover the key. That is the model's one nondeterministic
// step. A call whose outcome is unknown may or may not have taken effect.

// transition is one way a call can go from a state.
type transition struct {
	out  Output
	next Snapshot
}

func claimSteps(s Snapshot, in Input) []transition {
	if s.State == 0 {
		// Absent, or a released first attempt's marker, which keeps the
		// released holder's fence: the next is above it.
		n := Snapshot{State: guard.StatePending, Token: in.Token, Fingerprint: in.Fingerprint, Fence: s.Fence + 1, Attempt: 1, Ptok: s.Ptok}
		return []transition{{Output{Status: guard.Acquired, Fence: n.Fence, Attempt: 1}, n}}
	}
	if s.Fingerprint != in.Fingerprint {
		return []transition{{Output{Status: guard.Mismatch}, s}}
	}
	switch s.State {
	case guard.StateCompleted:
		return []transition{{Output{Status: guard.Replay, Result: s.Result}, s}}
	case guard.StatePending:
		if s.Token == in.Token { // the same claim again: the same answer
			return []transition{{Output{Status: guard.Acquired, Fence: s.Fence, Attempt: s.Attempt, Recovered: s.Recovered, Steps: s.Steps}, s}}
		}
		// The holder's lease may be alive, or may have run out.
		ts := append([]transition{{Output{Status: guard.InProgress}, s}}, recoverSteps(s, in, true)...)
		if n := ts[1].next; ts[1].out.Status == guard.Exhausted && n != s {
			// A claim at its MaxAttempts that found the lease run out
			// recorded the attempt failed ("lease expired") and answered
			// EXHAUSTED; go-redis re-sent it after losing that reply, and
			// the copy met a holder with a larger limit of its own that
			// had taken the key meanwhile: IN_PROGRESS. The caller learns
			// less than happened (docs/design.md, rule 2).
			ts = append(ts, transition{Output{Status: guard.InProgress}, n})
		}
		return ts
	case guard.StateFailed:
		if s.Token == in.Token {
			// A copy of the claim that comes after its holder failed or
			// released it takes nothing (docs/design.md, rule 2).
			return []transition{{Output{Status: guard.InProgress}, s}}
		}
		return recoverSteps(s, in, false)
	}
	return nil
}

func recoverSteps(s Snapshot, in Input, expired bool) []transition {
	if in.MaxAttempts > 0 && s.Attempt >= in.MaxAttempts {
		n := s
		if expired {
			n.State, n.LastError = guard.StateFailed, "lease expired"
		}
		return []transition{{Output{Status: guard.Exhausted, Attempt: n.Attempt, LastError: n.LastError}, n}}
	}
	n := s
	n.State, n.Token, n.Fence, n.Attempt, n.Recovered = guard.StatePending, in.Token, s.Fence+1, s.Attempt+1, expired
	n.Ptok = s.Token // the failed (or released) holder
	if expired {
		n.Ptok = "" // the old holder never ended its claim
	}
	return []transition{{Output{Status: guard.Acquired, Fence: n.Fence, Attempt: n.Attempt, Recovered: expired, Steps: n.Steps}, n}}
}

func writeSteps(s Snapshot, in Input) []transition {
	ok := func(n Snapshot) []transition { return []transition{{Output{OK: true}, n}} }
	lost := []transition{{Output{OK: false}, s}}
	// okOrResent is a fail or release by the holder: it takes effect, and
	// answers OK, or LOST when the answer came from a copy go-redis
	// re-sent after losing the reply and the key was taken over more than
	// once meanwhile (ptok remembers one previous holder: docs/design.md,
	// "The state machine", rule 2). The caller learns less than happened,
	// never more; the contract suite pins the answer of a call that was
	// not re-sent.
	okOrResent := func(n Snapshot) []transition {
		return []transition{{Output{OK: true}, n}, {Output{OK: false}, n}}
	}
	switch in.Op {
	case OpComplete:
		if s.Token != in.Token || s.State == 0 {
			return lost
		}
		switch s.State {
		case guard.StateCompleted:
			return ok(s)
		case guard.StatePending:
			n := s
			n.State, n.Result, n.Steps = guard.StateCompleted, in.Value, ""
			return ok(n)
		}
		return lost
	case OpFail:
		if s.State != 0 && s.Token != in.Token && s.Ptok == in.Token {
			return ok(s) // a retry of the fail that let the current holder in
		}
		if s.Token != in.Token || s.State == 0 {
			return lost
		}
		switch s.State {
		case guard.StateFailed:
			return ok(s)
		case guard.StatePending:
			n := s
			n.State, n.LastError = guard.StateFailed, in.Value
			return okOrResent(n)
		}
		return lost
	case OpRelease:
		if s.State == 0 {
			return ok(s)
		}
		if s.Token != in.Token {
			if s.Ptok == in.Token {
				return ok(s) // a retry of the release that let the current holder in
			}
			return lost
		}
		switch s.State {
		case guard.StateFailed:
			return ok(s)
		case guard.StatePending:
			if s.Attempt <= 1 && s.Steps == "" {
				return okOrResent(Snapshot{Ptok: in.Token, Fence: s.Fence})
			}
			n := s
			n.State, n.Attempt = guard.StateFailed, max(s.Attempt-1, 1)
			return okOrResent(n)
		}
		return lost
	case OpExtend:
		if s.State == guard.StatePending && s.Token == in.Token {
			return ok(s)
		}
		return lost
	case OpGet:
		if s.State == 0 {
			return []transition{{Output{Found: false}, s}}
		}
		r := s
		r.Ptok = ""
		return []transition{{Output{Found: true, Record: r}, s}}
	}
	return nil
}

func steps(s Snapshot, in Input) []transition {
	switch in.Op {
	case OpClaim:
		return claimSteps(s, in)
	case OpStep:
		return stepSteps(s, in)
	}
	return writeSteps(s, in)
}

// matches reports whether an observed output is the one a transition gives.
func matches(in Input, want, got Output) bool {
	switch in.Op {
	case OpClaim:
		if want.Status != got.Status {
			return false
		}
		switch got.Status {
		case guard.Acquired:
			return want.Fence == got.Fence && want.Attempt == got.Attempt && want.Recovered == got.Recovered &&
				want.Steps == got.Steps
		case guard.Replay:
			return want.Result == got.Result
		case guard.Exhausted:
			return want.Attempt == got.Attempt && want.LastError == got.LastError
		}
		return true // in progress (time left is not modelled), mismatch
	case OpGet:
		return want.Found == got.Found && want.Record == got.Record
	}
	return want.OK == got.OK && want.Order == got.Order
}

// Model is the porcupine model of one key's record, partitioned by key.
var Model = porcupine.NondeterministicModel{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		idx := map[guard.Key]int{}
		var parts [][]porcupine.Operation
		for _, op := range h {
			k := op.Input.(Input).Key
			i, ok := idx[k]
			if !ok {
				i = len(parts)
				idx[k] = i
				parts = append(parts, nil)
			}
			parts[i] = append(parts[i], op)
		}
		return parts
	},
	Init: func() []any { return []any{Snapshot{}} },
	Step: func(state, input, output any) []any {
		s, in, got := state.(Snapshot), input.(Input), output.(Output)
		if got.Bad {
			return nil
		}
		var next []any
		if got.Unknown {
			next = append(next, s) // it did not happen
		}
		for _, t := range steps(s, in) {
			if got.Unknown || matches(in, t.out, got) {
				next = append(next, t.next)
			}
		}
		return next
	},
	Equal:             func(a, b any) bool { return a.(Snapshot) == b.(Snapshot) },
	DescribeOperation: func(input, output any) string { return describeOp(input.(Input), output.(Output)) },
	DescribeState:     func(state any) string { return describeSnapshot(state.(Snapshot)) },
}

func short(tok string) string {
	if len(tok) > 6 {
		return tok[:6]
	}
	return tok
}

func describeOp(in Input, out Output) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s(%s", in.Op, short(in.Token))
	if in.Op == OpStep {
		fmt.Fprintf(&b, ", #%d %s", in.Index, in.Name)
	}
	if in.Value != "" {
		fmt.Fprintf(&b, ", %q", in.Value)
	}
	b.WriteString(") → ")
	switch {
	case out.Unknown:
		b.WriteString("? " + out.Err)
	case out.Bad:
		b.WriteString("BAD " + out.Err)
	case in.Op == OpClaim:
		b.WriteString(out.Status.String())
		switch out.Status {
		case guard.Acquired:
			fmt.Fprintf(&b, " fence=%d attempt=%d recovered=%t", out.Fence, out.Attempt, out.Recovered)
			if out.Steps != "" {
				fmt.Fprintf(&b, " steps=%s", describeSteps(out.Steps))
			}
		case guard.Replay:
			fmt.Fprintf(&b, " %q", out.Result)
		case guard.Exhausted:
			fmt.Fprintf(&b, " after %d: %s", out.Attempt, out.LastError)
		}
	case in.Op == OpGet:
		if !out.Found {
			b.WriteString("not found")
		} else {
			b.WriteString(describeSnapshot(out.Record))
		}
	case out.OK:
		b.WriteString("OK")
	case out.Order:
		b.WriteString("ORDER")
	default:
		b.WriteString("LOST")
	}
	return b.String()
}

func describeSnapshot(s Snapshot) string {
	if s.State == 0 {
		return "absent"
	}
	d := fmt.Sprintf("%s(%s fence=%d attempt=%d", s.State, short(s.Token), s.Fence, s.Attempt)
	if s.Recovered {
		d += " recovered"
	}
	if s.Result != "" {
		d += fmt.Sprintf(" result=%q", s.Result)
	}
	if s.Steps != "" {
		d += " steps=" + describeSteps(s.Steps)
	}
	return d + ")"
}

// Check checks history for linearizability against Model within timeout.
// When the answer is not Ok, it writes porcupine's HTML visualisation to a
// temporary file and returns its path.
func Check(history []porcupine.Operation, timeout time.Duration) (porcupine.CheckResult, string, error) {
	m := Model.ToModel()
	res, info := porcupine.CheckOperationsVerbose(m, history, timeout)
	if res == porcupine.Ok {
		return res, "", nil
	}
	f, err := os.CreateTemp("", "idemguard-history-*.html")
	if err != nil {
		return res, "", fmt.Errorf("proof: visualisation: %w", err)
	}
	defer f.Close()
	if err := porcupine.Visualize(m, info, f); err != nil {
		return res, f.Name(), fmt.Errorf("proof: visualisation: %w", err)
	}
	return res, f.Name(), nil
}

// Explain checks each key's calls alone and describes, in invocation
// order, the calls of the first key that is not linearizable; "" if every
// key is. Times are milliseconds from the start of the history.
func Explain(history []porcupine.Operation, timeout time.Duration) string {
	m := Model.ToModel()
	for _, part := range Model.Partition(history) {
		if porcupine.CheckOperationsTimeout(m, part, timeout) == porcupine.Ok {
			continue
		}
		slices.SortFunc(part, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
		var b strings.Builder
		fmt.Fprintf(&b, "key %s:\n", part[0].Input.(Input).Key)
		for _, op := range part {
			fmt.Fprintf(&b, "  client %2d [%9.3f, %9.3f] %s\n", op.ClientId,
				float64(op.Call)/1e6, float64(op.Return)/1e6, describeOp(op.Input.(Input), op.Output.(Output)))
		}
		return b.String()
	}
	return ""
}
