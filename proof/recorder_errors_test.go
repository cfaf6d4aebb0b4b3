package proof

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// errStore answers every write with err (nil methods it does not
// override panic: the test calls only these).
type errStore struct {
	guard.Store
	err error
}

func (s errStore) Complete(context.Context, guard.Lease, []byte, time.Duration) error { return s.err }
func (s errStore) Fail(context.Context, guard.Lease, string, time.Duration) error     { return s.err }

// TestRecorderClassifiesErrors: the Recorder is what turns a store's
// answers into the history the model judges. An error no correct store
// gives (a script error, a corrupt reply) must be recorded Bad, which no
// model step accepts; recorded Unknown it would be accepted as "may or may
// not have happened" and a store failing its scripts would pass the
// nemesis' linearizability check. LOST and unavailable keep their meaning.
func TestRecorderClassifiesErrors(t *testing.T) {
	l := guard.Lease{Key: mk, Token: "A"}
	for _, c := range []struct {
		err  error
		want Output
	}{
		{errors.New("ERR user_script:1: Script attempted to access nonexistent global variable"), Output{Bad: true}},
		{fmt.Errorf("x: %w", guard.ErrCorrupt), Output{Bad: true}},
		{fmt.Errorf("x: %w", guard.ErrLeaseLost), Output{OK: false}},
		{fmt.Errorf("x: %w", guard.ErrUnavailable), Output{Unknown: true}},
		{nil, Output{OK: true}},
	} {
		rec := NewRecorder(errStore{err: c.err})
		_ = rec.Complete(context.Background(), l, []byte("r"), time.Hour)
		_ = rec.Fail(context.Background(), l, "x", time.Hour)
		for _, op := range rec.History() {
			got := op.Output.(Output)
			got.Err = ""
			if got != c.want {
				t.Errorf("%s answered %v: recorded %+v, want %+v", op.Input.(Input).Op, c.err, got, c.want)
			}
		}
	}
}
