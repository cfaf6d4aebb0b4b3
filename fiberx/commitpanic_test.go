package fiberx_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/gofiber/fiber/v3"

	"github.com/idemguard/idemguard/fiberx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// TestCommitResponseThenPanic: httpx's TestCommitResponseThenPanic
// on Fiber. A handler that panics after fiberx.CommitResponse committed
// its charge (a deferred metric, a log call) must not tell the client its
// request failed: the money moved. Under httpx the client gets the
// committed response, Redis stores its bytes, and the retry replays it.
// Under fiberx the core's panic path looks for the commit on a net/http
// Capture only, so the key was released and the client told "the
// handler failed; the key was released, retry with the same key" (500).
func TestCommitResponseThenPanic(t *testing.T) {
	s := newCharges(t, false)
	g := guard.New(s.rs, guard.Options{})
	s.app = fiber.New()
	s.app.Post("/charges", fiberx.Guard(g, fiberx.Options{Options: httpx.Options{SingleCaller: true}}), func(c fiber.Ctx) error {
		_ = s.charge(c)
		panic("metrics: nil map")
	})
	first := s.post(t, "ch-panic")
	if first.status != http.StatusCreated || first.replayed || first.location == "" {
		t.Errorf("first: %+v; want the committed 201 (CommitResponse: %v)", first, s.outcomes)
	}
	k := guard.Key{Scope: "POST /charges", ID: "ch-panic"}
	if rec, err := s.rs.Get(context.Background(), k); err != nil || rec.State != guard.StateCompleted {
		t.Errorf("redis record %+v, %v; want completed with the committed response", rec, err)
	}
	if again := s.post(t, "ch-panic"); !again.replayed || again.status != http.StatusCreated || again.body != first.body {
		t.Errorf("retry: %+v; want the first answer replayed", again)
	}
	if n := s.rows(t); n != 1 {
		t.Errorf("%d charges, want 1", n)
	}
}
