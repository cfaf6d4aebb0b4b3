package httpx

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
)

// CommitResponse ends a guarded handler whose business effect is made in
// tx, a transaction on the backstop's database. It encodes the response
// the client is to receive (status, the header fields the handler set that
// the replay rules keep, body) in the stored-response format the
// middleware keeps in Redis, commits that as the key's row with
// b.Commit, commits tx, and answers with exactly that response. The
// middleware then stores the very bytes that were committed, so the
// client, replays from Redis, and replays from PostgreSQL after Redis
// forgot the key all get the same response, byte for byte.
//
// CommitResponse writes the answer itself, in every outcome, and ends tx
// (commit or rollback). After it returns, the response is sealed: further
// writes by the handler fail and header changes are not sent. It writes
// to the Guard's own writer, so response-writer middleware between the
// Guard and the handler does not see the response: put such middleware
// outside the Guard. Set the response's header fields on w before calling
// it. The outcomes (see the package documentation, "Recipes"):
//
//   - nil: the row and tx are committed; the response is sent and stored.
//   - an error matching backstop.ErrAlreadyCommitted: the key's effect
//     was committed before (Redis had forgotten it); tx is rolled back,
//     and the stored response is answered with its own status, header
//     fields and body, and Idempotent-Replayed: true.
//   - an error matching backstop.ErrStaleFence or guard.ErrLeaseLost:
//     another request holds the key now; tx is rolled back and the answer
//     is Options.InFlightStatus (409) with Retry-After, not stored, so the
//     retry gets the response of the request that holds the key. A 409,
//     not a 5xx: nothing failed, the key is being answered by another
//     request; and the middleware releases instead of storing it whatever
//     Options.Store5xx says, so it can never become the key's final answer.
//   - an error matching guard.ErrUnavailable: the backstop could not be
//     reached, or the commit's outcome is unknown (the connection broke
//     during COMMIT); the answer is 503 with Retry-After, nothing is
//     stored, and the key is released, so the retry either finds the
//     committed row (and replays it) or runs the handler again.
//   - an error matching guard.ErrMismatch: the key's row was committed for
//     another request; 422, nothing stored.
//   - any other error: 500 (ProblemStoreError), nothing stored.
//
// A 5xx status is not committed unless Options.Store5xx: tx is rolled
// back, the response is sent and the key released, as for any 5xx. A body
// over Options.MaxStoredResponse reaches the client, and the key keeps a
// marker (replays say the response was not kept), in both stores.
//
// Outside a guarded run (a method that is not guarded, an optional key
// left out) CommitResponse commits tx and writes the response to w; if
// the commit fails it answers 503.
func CommitResponse(w http.ResponseWriter, r *http.Request, tx *sql.Tx, b *backstop.Backstop, status int, body []byte) error {
	ci, guarded := r.Context().Value(claimKey{}).(*claimInfo)
	if !guarded || ci.c == nil {
		return commitUnguarded(w, tx, status, body)
	}
	c, m, key := ci.c, ci.m, ci.lease.Key
	ctx := r.Context()
	switch {
	case tx == nil:
		return c.answerProblem(m, errors.New("httpx: CommitResponse needs the business transaction, got nil"))
	case b == nil:
		_ = tx.Rollback()
		return c.answerProblem(m, errors.New("httpx: CommitResponse needs the backstop, got nil"))
	case c.sealed || c.wroteHeader || c.hijacked:
		// The handler answered already: its effect must not be final
		// under a response it did not commit.
		_ = tx.Rollback()
		c.release = true
		return errors.New("httpx: CommitResponse after the response was written; transaction rolled back, key released")
	case status < 200 || status > 999:
		_ = tx.Rollback()
		return c.answerProblem(m, fmt.Errorf("httpx: CommitResponse with status %d; want a final status (200-999)", status))
	}

	h := c.w.Header()
	if _, typed := h["Content-Type"]; !typed && len(body) > 0 && h.Get("Transfer-Encoding") == "" {
		// What net/http would send (capture.Write does the same), so that
		// the committed response has it too.
		h.Set("Content-Type", http.DetectContentType(body))
	}
	if status >= 500 && !m.opts.Store5xx {
		_ = tx.Rollback()
		c.release = true
		c.writeSealed(status, body)
		return fmt.Errorf("httpx: status %d not committed (Options.Store5xx is off); transaction rolled back, key released", status)
	}
	var result []byte
	if len(body) > m.opts.MaxStoredResponse {
		result = encodeResponse(storedResponse{status: status, notKept: notKeptTooLarge})
	} else {
		result = m.encodeHandlerResponse(status, c.before, h, body)
	}

	err := b.Commit(ctx, tx, ci.lease, ci.fingerprint, result)
	if err == nil {
		if cerr := tx.Commit(); cerr != nil {
			err = fmt.Errorf("%w: commit of the business transaction (outcome unknown): %w", guard.ErrUnavailable, cerr)
		}
	} else {
		_ = tx.Rollback()
	}
	if err == nil {
		c.stored = result
		c.writeSealed(status, body)
		return nil
	}

	resetHeader(h, c.before) // the fields set for the response not sent
	if done, ok := errors.AsType[*backstop.AlreadyCommittedError](err); ok {
		stored, derr := parseResponse(done.Result)
		if derr != nil {
			// Committed by something other than CommitResponse.
			m.opts.Logger.Error("httpx: committed response unreadable",
				append(m.logKey(key), "path", r.URL.Path, "err", m.logErr(key, derr))...)
			writeProblem(c, Problem{Type: ProblemCorruptResponse, Status: http.StatusInternalServerError,
				Title: "Stored response unreadable", Key: key.ID,
				Detail: "the request with this key ran, but its stored response cannot be read"})
			c.release, c.sealed = true, true
			return errors.Join(err, derr)
		}
		writeStored(c, key.ID, stored)
		c.stored, c.sealed = done.Result, true
		return err
	}
	c.release = true
	switch {
	case errors.Is(err, backstop.ErrStaleFence), errors.Is(context.Cause(ctx), guard.ErrLeaseLost):
		m.inFlight(c, key.ID, ci.route, 0)
	case errors.Is(err, guard.ErrMismatch):
		writeProblem(c, Problem{Type: ProblemKeyMismatch, Status: http.StatusUnprocessableEntity,
			Title: "Idempotency key reused", Key: key.ID,
			Detail: "this key was used with a different request; use a new key for a new request"})
	case errors.Is(err, guard.ErrUnavailable), ctx.Err() != nil:
		m.unavailable(c, key.ID, "the request's effect was not committed; retry later with the same key")
	default:
		m.opts.Logger.Error("httpx: backstop commit failed",
			append(m.logKey(key), "path", r.URL.Path, "err", m.logErr(key, err))...)
		writeProblem(c, Problem{Type: ProblemStoreError, Status: http.StatusInternalServerError,
			Title: "Idempotency store error", Key: key.ID,
			Detail: "the request's effect was not committed"})
	}
	c.sealed = true
	return err
}

// writeSealed writes status and body as the whole response and seals it.
func (c *capture) writeSealed(status int, body []byte) {
	c.WriteHeader(status)
	if len(body) > 0 {
		_, _ = c.Write(body)
	}
	c.sealed = true
}

// answerProblem answers a misuse of CommitResponse with a 500 that is not
// stored, and returns err.
func (c *capture) answerProblem(m *middleware, err error) error {
	c.release = true
	if !c.wroteHeader && !c.hijacked && !c.sealed {
		resetHeader(c.w.Header(), c.before)
		writeProblem(c, Problem{Type: ProblemStoreError, Status: http.StatusInternalServerError,
			Title: "Internal server error", Detail: "the request's effect was not committed"})
		c.sealed = true
	}
	m.opts.Logger.Error("httpx: CommitResponse misused", "err", err)
	return err
}

// commitUnguarded is CommitResponse for a request the Guard did not claim.
func commitUnguarded(w http.ResponseWriter, tx *sql.Tx, status int, body []byte) error {
	if tx == nil {
		return errors.New("httpx: CommitResponse needs the business transaction, got nil")
	}
	if err := tx.Commit(); err != nil {
		writeProblem(w, Problem{Type: "about:blank", Status: http.StatusServiceUnavailable,
			Title: "Service unavailable", Detail: "the request's effect may not have been committed"})
		return fmt.Errorf("httpx: commit: %w", err)
	}
	w.WriteHeader(status)
	if len(body) > 0 {
		_, _ = w.Write(body)
	}
	return nil
}
