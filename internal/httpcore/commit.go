package httpcore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
)

// CommitResponse is httpx.CommitResponse (its doc says what it does) for
// any binding whose handler writes to the run's Capture: ctx is the
// handler's context, path the request's, for logs.
func CommitResponse(w http.ResponseWriter, ctx context.Context, path string, tx *sql.Tx, b *backstop.Backstop, status int, body []byte) error {
	ci, guarded := ctx.Value(claimKey{}).(*claimInfo)
	if !guarded {
		return commitUnguarded(w, tx, status, body)
	}
	if ci.c == nil {
		if tx != nil {
			_ = tx.Rollback()
		}
		return errors.New("httpx: CommitResponse in a handler whose response is not captured (Fiber); transaction rolled back")
	}
	c, m, key := ci.c, ci.m, ci.lease.Key
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
	if _, typed := h["Content-Type"]; !typed && len(body) > 0 && h.Get("Transfer-Encoding") == "" && h.Get("Content-Encoding") == "" {
		// What net/http would send (capture.Write does the same), so that
		// the committed response has it too.
		h.Set("Content-Type", http.DetectContentType(body))
	}
	if m.releases(status) {
		_ = tx.Rollback()
		c.release = true
		c.writeSealed(status, body)
		return fmt.Errorf("httpx: status %d not committed (it releases the key: Options.Store5xx is off); transaction rolled back, key released", status)
	}
	var result []byte
	var trailers []snapField
	kept := len(body) <= m.opts.MaxStoredResponse
	if !kept {
		result = encodeResponse(storedResponse{status: status, notKept: notKeptTooLarge})
	} else {
		// Without a Content-Type now (the handler set it to nil), the
		// response goes out without one: untyped, so that a replay does
		// not sniff one.
		var scratch [16]snapField
		fields := fieldsOf(h, scratch[:])
		// The trailers set so far are stored, and are the ones the
		// response sends (committedTrailers).
		trailers = trailerFields(fields, h, nil)
		result = m.encodeHandlerResponse(status, c.before, fields, trailers, body, !hasValues(fields, "Content-Type"))
	}

	err := b.Commit(ctx, tx, ci.lease, ci.fingerprint, result)
	if err == nil {
		if cerr := tx.Commit(); cerr != nil {
			err = fmt.Errorf("%w: commit of the business transaction (outcome unknown): %w", guard.ErrUnavailable, cerr)
		}
	} else {
		_ = tx.Rollback()
	}
	if err != nil && ctx.Err() != nil {
		// The statement failed because the handler's context ended: say
		// why it ended (a lost lease matches guard.ErrLeaseLost), as the
		// answer below does.
		if cause := context.Cause(ctx); !errors.Is(err, cause) {
			err = fmt.Errorf("%w (the request's context ended: %w)", err, cause)
		}
	}
	if err == nil {
		c.stored = result
		c.committedTrailers, c.fixedTrailers = trailers, kept
		c.writeSealed(status, body)
		return nil
	}

	resetHeader(h, c.before) // the fields set for the response not sent
	if done, ok := errors.AsType[*backstop.AlreadyCommittedError](err); ok {
		stored, derr := parseResponse(done.Result)
		if derr != nil {
			// Committed by something other than CommitResponse.
			m.opts.Logger.Error(m.log+"committed response unreadable",
				append(m.logKey(key), "path", path, "err", m.logErr(key, derr))...)
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
		m.opts.Logger.Error(m.log+"backstop commit failed",
			append(m.logKey(key), "path", path, "err", m.logErr(key, err))...)
		writeProblem(c, Problem{Type: ProblemStoreError, Status: http.StatusInternalServerError,
			Title: "Idempotency store error", Key: key.ID,
			Detail: "the request's effect was not committed"})
	}
	c.sealed = true
	return err
}

// writeSealed writes status and body as the whole response and seals it.
func (c *Capture) writeSealed(status int, body []byte) {
	c.WriteHeader(status)
	if len(body) > 0 {
		_, _ = c.Write(body)
	}
	c.sealed = true
}

// answerProblem answers a misuse of CommitResponse with a 500 that is not
// stored, and returns err.
func (c *Capture) answerProblem(m *Engine, err error) error {
	c.release = true
	if !c.wroteHeader && !c.hijacked && !c.sealed {
		resetHeader(c.w.Header(), c.before)
		writeProblem(c, Problem{Type: ProblemStoreError, Status: http.StatusInternalServerError,
			Title: "Internal server error", Detail: "the request's effect was not committed"})
		c.sealed = true
	}
	m.opts.Logger.Error(m.log+"CommitResponse misused", "err", err)
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
