package httpcore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/pgsql"
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
		return errors.New("httpx: CommitResponse in a handler whose response is not captured (Fiber: use fiberx.CommitResponse); transaction rolled back")
	}
	c, m := ci.c, ci.m
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
	if m.releases(status) {
		_ = tx.Rollback()
		c.release = true
		c.writeSealed(status, body)
		return releasedErr(status)
	}
	// The trailers set so far are stored, and are the ones the response
	// sends (committedTrailers).
	result, trailers, kept := m.encodeCommitted(status, h, c.before, body, true)
	err := commitRow(ctx, tx, b, ci, result)
	if err == nil {
		c.stored = result
		c.committedTrailers, c.fixedTrailers = trailers, kept
		c.writeSealed(status, body)
		return nil
	}
	resetHeader(h, c.before) // the fields set for the response not sent
	c.stored, c.release, err = m.answerCommitErr(c, ctx, ci, path, err)
	c.sealed = true
	return err
}

// CommitBuffered is CommitResponse for a binding that builds the response
// in memory and hands it to the core once the handlers returned (Fiber):
// w writes that response (its header is the response's, before the
// fields outer middleware set when the handlers were called), ctx is the
// handler's context, path the request's, for logs. It answers on w as
// CommitResponse does, and returns what the binding's Result must say:
// the bytes to store as they are (stored), or that the key is released
// with nothing stored (release).
func CommitBuffered(w http.ResponseWriter, ctx context.Context, before http.Header, path string, tx *sql.Tx, b *backstop.Backstop, status int, body []byte) (stored []byte, release bool, err error) {
	ci, guarded := ctx.Value(claimKey{}).(*claimInfo)
	if !guarded {
		return nil, false, commitUnguarded(w, tx, status, body)
	}
	m := ci.m
	problem := func(err error) ([]byte, bool, error) {
		resetHeader(w.Header(), before)
		writeProblem(w, Problem{Type: ProblemStoreError, Status: http.StatusInternalServerError,
			Title: "Internal server error", Detail: "the request's effect was not committed"})
		m.opts.Logger.Error(m.log+"CommitResponse misused", "err", err)
		return nil, true, err
	}
	switch {
	case tx == nil:
		return problem(errors.New("CommitResponse needs the business transaction, got nil"))
	case b == nil:
		_ = tx.Rollback()
		return problem(errors.New("CommitResponse needs the backstop, got nil"))
	case status < 200 || status > 999:
		_ = tx.Rollback()
		return problem(fmt.Errorf("CommitResponse with status %d; want a final status (200-999)", status))
	}
	h := w.Header()
	if m.releases(status) {
		_ = tx.Rollback()
		w.WriteHeader(status)
		_, _ = w.Write(body)
		return nil, true, releasedErr(status)
	}
	result, _, _ := m.encodeCommitted(status, h, before, body, false)
	if err := commitRow(ctx, tx, b, ci, result); err != nil {
		resetHeader(h, before)
		return m.answerCommitErr(w, ctx, ci, path, err)
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
	return result, false, nil
}

// releasedErr is CommitResponse's error for a status that releases the key.
func releasedErr(status int) error {
	return fmt.Errorf("httpx: status %d not committed (it releases the key: Options.Store5xx is off); transaction rolled back, key released", status)
}

// encodeCommitted is the stored-response record of the response
// CommitResponse commits: status, the fields of h (those equal to
// before's are outer middleware's), body; with trailers, the trailer
// fields set in h so far, which it returns. kept is false for a body over
// MaxStoredResponse (a marker is committed). h gets the Content-Type
// net/http would send, so that the committed response has it too.
func (m *Engine) encodeCommitted(status int, h, before http.Header, body []byte, trailers bool) (result []byte, stored []snapField, kept bool) {
	if _, typed := h["Content-Type"]; !typed && len(body) > 0 && h.Get("Transfer-Encoding") == "" && h.Get("Content-Encoding") == "" {
		h.Set("Content-Type", http.DetectContentType(body)) // as capture.Write does
	}
	if len(body) > m.opts.MaxStoredResponse {
		return encodeResponse(storedResponse{status: status, notKept: notKeptTooLarge}), nil, false
	}
	// Without a Content-Type now (the handler set it to nil), the
	// response goes out without one: untyped, so that a replay does not
	// sniff one.
	var scratch [16]snapField
	fields := fieldsOf(h, scratch[:])
	if trailers {
		stored = trailerFields(fields, h, nil)
	}
	return m.encodeHandlerResponse(status, before, fields, stored, body, !hasValues(fields, "Content-Type")), stored, true
}

// commitRow commits result as the key's row of ci's lease in tx (the
// business transaction), and tx with it; on an error tx is rolled back,
// and an error of a context that ended says why it ended (a lost lease
// matches guard.ErrLeaseLost).
func commitRow(ctx context.Context, tx *sql.Tx, b *backstop.Backstop, ci *claimInfo, result []byte) error {
	err := b.Commit(ctx, tx, ci.lease, ci.fingerprint, result)
	if err == nil {
		if cerr := tx.Commit(); cerr != nil && pgsql.Unavailable(cerr) {
			err = fmt.Errorf("%w: commit of the business transaction (outcome unknown): %w", guard.ErrUnavailable, cerr)
		} else if cerr != nil {
			// Refused (a deferred constraint): rolled back for good.
			err = fmt.Errorf("commit of the business transaction: %w", cerr)
		}
	} else {
		_ = tx.Rollback()
	}
	if err != nil && ctx.Err() != nil {
		if cause := context.Cause(ctx); !errors.Is(err, cause) {
			err = fmt.Errorf("%w (the request's context ended: %w)", err, cause)
		}
	}
	return err
}

// answerCommitErr answers on w (its header back to the fields before the
// response) a commit that failed with err or found the key's row
// committed, and returns the bytes to store (that row, replayed) or
// release, and the error CommitResponse returns.
func (m *Engine) answerCommitErr(w http.ResponseWriter, ctx context.Context, ci *claimInfo, path string, err error) (stored []byte, release bool, _ error) {
	key := ci.lease.Key
	if done, ok := errors.AsType[*backstop.AlreadyCommittedError](err); ok {
		sr, derr := parseResponse(done.Result)
		if derr != nil {
			// Committed by something other than CommitResponse.
			m.opts.Logger.Error(m.log+"committed response unreadable",
				append(m.logKey(key), "path", path, "err", m.logErr(key, derr))...)
			writeProblem(w, Problem{Type: ProblemCorruptResponse, Status: http.StatusInternalServerError,
				Title: "Stored response unreadable", Key: key.ID,
				Detail: "the request with this key ran, but its stored response cannot be read"})
			return nil, true, errors.Join(err, derr)
		}
		writeStored(w, key.ID, sr)
		return done.Result, false, err
	}
	switch {
	case errors.Is(err, backstop.ErrStaleFence), errors.Is(context.Cause(ctx), guard.ErrLeaseLost):
		m.inFlight(w, key.ID, ci.route, 0)
	case errors.Is(err, guard.ErrMismatch):
		writeProblem(w, Problem{Type: ProblemKeyMismatch, Status: http.StatusUnprocessableEntity,
			Title: "Idempotency key reused", Key: key.ID,
			Detail: "this key was used with a different request; use a new key for a new request"})
	case errors.Is(err, guard.ErrUnavailable), ctx.Err() != nil:
		m.unavailable(w, key.ID, "the request's effect was not committed; retry later with the same key")
	default:
		m.opts.Logger.Error(m.log+"backstop commit failed",
			append(m.logKey(key), "path", path, "err", m.logErr(key, err))...)
		writeProblem(w, Problem{Type: ProblemStoreError, Status: http.StatusInternalServerError,
			Title: "Idempotency store error", Key: key.ID,
			Detail: "the request's effect was not committed"})
	}
	return nil, true, err
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
