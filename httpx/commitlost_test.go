package httpx_test

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestCommitResponseLeaseLostError: a handler whose lease was lost before
// CommitResponse (Redis forgot the key; the heartbeat found out and ended
// the handler's context) gets the 409 of the recipe's table, and the
// error the table pairs with it, one matching guard.ErrLeaseLost, not the
// bare "context canceled" of the statement the ended context refused
// (which the table files under "any other error: 500").
func TestCommitResponseLeaseLostError(t *testing.T) {
	s := newCharges(t, testenv.Redis(t), testenv.Prefix(t), chargesOptions{guarded: true})
	s.g = guard.New(backstop.Wrap(s.rs, s.b), guard.Options{Lease: time.Second})
	s.handler = authenticate(httpx.Guard(s.g, httpx.Options{Logger: testenv.Logger(t),
		Tenant: httpx.TenantFromContext[string](accountKey{}, nil)})(http.HandlerFunc(s.charge)))
	s.hook = func(r *http.Request, _ *sql.Tx, _ guard.Lease) {
		s.forget(t, "ll-1")
		<-r.Context().Done() // the next extension finds the key gone
		if cause := context.Cause(r.Context()); !errors.Is(cause, guard.ErrLeaseLost) {
			t.Errorf("the handler's context ended with %v, want the lease lost", cause)
		}
	}
	srv, c := serve(t, s.handler)
	r := chargeReq(t, c, srv.URL, "ll-1")
	if r.status != http.StatusConflict || r.problem(t).Type != httpx.ProblemInFlight || r.header.Get("Retry-After") == "" {
		t.Fatalf("lease lost before CommitResponse: %d %s", r.status, r.body)
	}
	if n := s.outcome("stale"); n != 1 {
		t.Fatalf("CommitResponse's errors by class %v; want one matching guard.ErrLeaseLost", s.outcomes)
	}
	if rows, _ := s.rows(t); rows != 0 {
		t.Fatalf("%d charges committed by a request that lost its lease", rows)
	}
}
