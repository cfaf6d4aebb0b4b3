package consumerx_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// A handler's error wrapping guard.ErrRejected (a lock.Guarded section in
// it, say) is a counted attempt: the guard does not see it unwrap. When
// the store then refuses to record the failure, the error Process returns
// still matches the handler's error, as it does for any other handler's
// error (it matched neither the handler's sentinel nor ErrRejected).
func TestRejectedHandlerErrorKeptWhenFailureNotRecorded(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb, admin := srv.Client(), srv.Client()
	g := guard.New(guardenv.StoreOn(t, rdb, guard.RedisOptions{}), guard.Options{})
	p := newProcessor(t, g, "billing", consumerx.Options{})
	errLocked := errors.New("account locked")
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"plain", errLocked},
		{"rejected", fmt.Errorf("%w: %w", errLocked, guard.ErrRejected)},
	} {
		for _, batch := range []bool{false, true} {
			if err := admin.ConfigSet(ctx, "min-replicas-to-write", "0").Err(); err != nil {
				t.Fatal(err)
			}
			h := func(ctx context.Context, msg consumerx.Message) error {
				// Redis refuses writes after the claim, before the failure
				// is recorded.
				if err := admin.ConfigSet(ctx, "min-replicas-to-write", "1").Err(); err != nil {
					t.Error(err)
				}
				return tc.err
			}
			msg := consumerx.Message{ID: fmt.Sprintf("order-%s-%v", tc.name, batch), Payload: []byte("charge")}
			var (
				o   consumerx.Outcome
				err error
			)
			if batch {
				r := p.ProcessBatch(ctx, []consumerx.Message{msg}, h, consumerx.BatchOptions{})[0]
				o, err = r.Outcome, r.Err
			} else {
				o, err = p.Process(ctx, msg, h)
			}
			if o != consumerx.Failed || !errors.Is(err, guard.ErrUnavailable) {
				t.Fatalf("%s (batch %v): %s, %v; want failed, the store's refusal", tc.name, batch, o, err)
			}
			if !errors.Is(err, errLocked) || errors.Is(tc.err, guard.ErrRejected) != errors.Is(err, guard.ErrRejected) {
				t.Errorf("%s (batch %v): %v matches the handler's error %v, ErrRejected %v; want true, %v",
					tc.name, batch, err, errors.Is(err, errLocked), errors.Is(err, guard.ErrRejected), errors.Is(tc.err, guard.ErrRejected))
			}
		}
	}
}
