package pgstore

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/idemguard/idemguard/guard"
)

// The Store's steps live in the key's row (columns steps and step_count,
// migration 4), as the Redis store keeps them in its record: claims report
// them, Fail, Release and recoveries keep them, completion (Complete, or
// backstop.Backstop.Commit in the business transaction) clears them.

const (
	// $1 scope, $2 id, $3 token, $4 index, $5 the step encoded
	saveStepSQL = `UPDATE %[1]s SET steps = COALESCE(steps, ''::bytea) || $5, step_count = step_count + 1
		WHERE scope = $1 AND id = $2 AND token = $3 AND status = 'pending' AND step_count = $4 AND expires_at > ` + clockNow
	readStepsSQL = `SELECT status, token, steps, step_count FROM %[1]s WHERE scope = $1 AND id = $2 AND expires_at > ` + clockNow
)

// withSteps is a claim's answer with the steps of the row it took.
func (r *claimRow) withSteps(out guard.Outcome, act claimAction) (guard.Outcome, claimAction, error) {
	steps, err := decodeSteps(r.steps)
	if err != nil {
		return guard.Outcome{}, actNone, fmt.Errorf("%s: %w", out.Lease.Key, err)
	}
	out.Steps = steps
	return out, act, nil
}

// SaveStep implements guard.StepStore: one conditional UPDATE appends the
// step to the holder's pending row when it holds exactly index steps; when
// it changes nothing, a read of the row says why (the caller does not
// hold a pending key: guard.ErrLeaseLost, whatever it sends; the step was
// recorded already, byte for byte: nil; other steps: a
// *guard.StepOrderError).
func (s *Store) SaveStep(ctx context.Context, lease guard.Lease, index int, step guard.StepResult) error {
	if err := guard.CheckStep(index, step.Name); err != nil {
		return err
	}
	k := lease.Key
	enc := appendStepBytes(nil, step)
	for range 4 {
		res, err := s.exec(ctx, s.q.saveStep, k.Scope, k.ID, lease.Token, index, enc)
		if err != nil {
			return dbErr(ctx, "step", err)
		}
		if n, _ := res.RowsAffected(); n == 1 {
			return nil
		}
		var status, token string
		var raw []byte
		var count int
		err = s.queryRow(ctx, s.q.readSteps, []any{k.Scope, k.ID}, &status, &token, &raw, &count)
		if errors.Is(err, sql.ErrNoRows) {
			return guard.ErrLeaseLost
		}
		if err != nil {
			return dbErr(ctx, "step", err)
		}
		steps, err := decodeSteps(raw)
		if err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
		if count != len(steps) {
			// Not a row that changed: one no statement of the Store writes.
			return fmt.Errorf("%w: %s: the steps column holds %d steps, step_count says %d", guard.ErrCorrupt, k, len(steps), count)
		}
		if status != "pending" || token != lease.Token {
			return guard.ErrLeaseLost
		}
		held := ""
		if index < len(steps) {
			at := steps[index]
			if at.Name == step.Name && bytes.Equal(at.Result, step.Result) {
				return nil // this step, recorded already: the call repeated
			}
			held = at.Name
		}
		if index != len(steps) {
			return &guard.StepOrderError{Key: k, Index: index, Asked: step.Name, Recorded: held, Steps: len(steps)}
		}
		// The row changed between the two statements: try again.
	}
	return fmt.Errorf("%w: step %s: the record kept changing", guard.ErrUnavailable, k)
}

// appendStepBytes and decodeSteps write and read the steps column of the
// keys table, in the Redis record's encoding (uvarint length + name,
// uvarint length + result, for each step in order).
func appendStepBytes(dst []byte, s guard.StepResult) []byte {
	dst = append(binary.AppendUvarint(dst, uint64(len(s.Name))), s.Name...)
	return append(binary.AppendUvarint(dst, uint64(len(s.Result))), s.Result...)
}

func decodeSteps(b []byte) ([]guard.StepResult, error) {
	var out []guard.StepResult
	for len(b) > 0 {
		var parts [2][]byte
		for i := range parts {
			n, k := binary.Uvarint(b)
			if k <= 0 || n > uint64(len(b)-k) {
				return nil, fmt.Errorf("%w: steps column cut short", guard.ErrCorrupt)
			}
			parts[i], b = b[k:k+int(n)], b[k+int(n):]
		}
		out = append(out, guard.StepResult{Name: string(parts[0]), Result: bytes.Clone(parts[1])})
	}
	return out, nil
}
