package memstore

import (
	"bytes"
	"context"

	"github.com/idemguard/idemguard/guard"
)

// SaveStep implements guard.StepStore, following the Redis store's
// step.lua: the holder of a pending key appends a step after the index
// steps it holds; a step the record already holds at index, byte for
// byte, answers the holder nil (the call repeated); a caller that does
// not hold a pending key gets guard.ErrLeaseLost, whatever it sends; a
// record with another number of steps, or another step at index, gives a
// *guard.StepOrderError. Nothing changes but on success. A copy of
// step.Result is kept. The steps are reported by Claim (Outcome.Steps)
// and Get until the key completes; Fail, Release and a recovery keep them
// (see guard.StepStore).
func (s *Store) SaveStep(ctx context.Context, lease guard.Lease, index int, step guard.StepResult) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := guard.CheckStep(index, step.Name); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	s.sweep(now, sweepBatch)
	e := s.held(lease, now)
	if e == nil || e.state != guard.StatePending || e.token != lease.Token {
		return guard.ErrLeaseLost
	}
	held := ""
	if index < len(e.steps) {
		at := e.steps[index]
		if at.Name == step.Name && bytes.Equal(at.Result, step.Result) {
			return nil // this step, recorded already: the call repeated
		}
		held = at.Name
	}
	if index != len(e.steps) {
		return &guard.StepOrderError{Key: lease.Key, Index: index, Asked: step.Name, Recorded: held, Steps: len(e.steps)}
	}
	e.steps = append(e.steps, guard.StepResult{Name: step.Name, Result: append([]byte{}, step.Result...)})
	s.resize(e)
	return nil
}

// stepsSize is what Stats.Bytes counts for steps: their names and results.
func stepsSize(steps []guard.StepResult) int64 {
	var n int64
	for _, st := range steps {
		n += int64(len(st.Name) + len(st.Result))
	}
	return n
}

// cloneSteps copies steps for a caller, so stored results are never
// changed in place.
func cloneSteps(steps []guard.StepResult) []guard.StepResult {
	if len(steps) == 0 {
		return nil
	}
	out := make([]guard.StepResult, len(steps))
	for i, st := range steps {
		out[i] = guard.StepResult{Name: st.Name, Result: bytes.Clone(st.Result)}
	}
	return out
}
