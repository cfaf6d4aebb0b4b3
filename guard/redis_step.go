package guard

import (
	"context"
	"fmt"

	"github.com/idemguard/idemguard/scripts"
)

// Steps in a RedisStore record (format version 2).
//
// A pending or failed record that holds steps is version 2: version 1's
// fields, then the steps, each
//
//	uvarint length + name (1..MaxStepNameLen bytes), uvarint length + result
//
// in the order they were recorded, up to the end of the value. The first
// step turns a version 1 record into version 2 (its first byte changes, the
// step is appended); a record without steps is never version 2, so keys
// that use no steps keep version 1 byte for byte, and a build that does
// not know steps refuses only the records that hold them (ErrCorrupt,
// nothing run). The steps stay with the record through failures,
// releases and recoveries (claim.lua, fail.lua and release.lua copy them)
// and go when it completes: a completed record is version 1 whether its
// key used steps or not, so steps cost nothing once a key is done.
//
// A step costs its encoded bytes (name + result + 2 to 4 bytes of
// lengths) in the record while the key is pending or failed, and one
// EVALSHA of step.lua (a GET, a SET with KEEPTTL, and the decoding of the
// record) to store (README, Steps).
const recordVersionSteps = 2

// parseSteps reads the steps of a version 2 record from i to the end of
// v, a record in state st, as record.lua's decode does.
func parseSteps(v string, i int, st byte) (steps string, next int, why string) {
	if st != stPending && st != stFailed {
		return "", i, "steps in a record that cannot hold them"
	}
	start := i
	for {
		n, j, ok := uvarint(v, i)
		if !ok || n < 1 || n > MaxStepNameLen || n > int64(len(v)-j) {
			return "", i, "bad step"
		}
		if _, i, ok = lenString(v, j+int(n)); !ok {
			return "", i, "bad step"
		}
		if i >= len(v) {
			return v[start:i], i, ""
		}
	}
}

// decodeSteps splits steps, as parseSteps returned them, into StepResults
// (nil for none).
func decodeSteps(steps string) []StepResult {
	if steps == "" {
		return nil
	}
	var out []StepResult
	for i := 0; i < len(steps); {
		name, j, _ := lenString(steps, i)
		result, k, _ := lenString(steps, j)
		out = append(out, StepResult{Name: name, Result: []byte(result)})
		i = k
	}
	return out
}

// pendingSteps is the steps of a pending record a claim left; nil for a
// version 1 record, without decoding it.
func pendingSteps(pending string) []StepResult {
	if len(pending) == 0 || pending[0] != recordVersionSteps {
		return nil
	}
	st, why := parseValue(pending)
	if why != "" {
		return nil // the claim's answer was checked already
	}
	return decodeSteps(st.steps)
}

// appendStep encodes a step as records keep it.
func appendStep(dst []byte, step StepResult) []byte {
	dst = append(appendUvarint(dst, int64(len(step.Name))), step.Name...)
	return append(appendUvarint(dst, int64(len(step.Result))), step.Result...)
}

// SaveStep implements StepStore: one EVALSHA of step.lua, a
// compare-and-set on the owner token that appends the step to the
// pending record, keeping its time to live.
func (s *RedisStore) SaveStep(ctx context.Context, lease Lease, index int, step StepResult) error {
	if err := CheckStep(index, step.Name); err != nil {
		return err
	}
	n, err := s.leaseNames(lease)
	if err != nil {
		return err
	}
	enc := &bytesArg{b: appendStep(make([]byte, 0, 2*maxUvarintLen+len(step.Name)+len(step.Result)), step)}
	reply, err := s.script(ctx, scripts.Step, []any{evalsha, nil, 1, n.name, n.tok, index, enc}).Result()
	if err != nil {
		return s.callErr(ctx, lease.Key, n.name, err)
	}
	switch r := reply.(type) {
	case int64:
		switch r {
		case 1:
			return nil
		case 0:
			return ErrLeaseLost
		}
	case []any:
		if len(r) == 3 {
			held, ok1 := r[1].(int64)
			name, ok2 := r[2].(string)
			if code, ok := r[0].(int64); ok && ok1 && ok2 && code == 2 {
				return &StepOrderError{Key: lease.Key, Index: index, Asked: step.Name, Recorded: name, Steps: int(held)}
			}
		}
	}
	return fmt.Errorf("%w: step reply %v", ErrCorrupt, reply)
}
