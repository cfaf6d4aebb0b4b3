package httpx

import (
	"database/sql"
	"net/http"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/internal/httpcore"
)

// CommitResponse ends a guarded handler whose business effect is made in
// tx, a transaction on the backstop's database. It encodes the response
// the client is to receive (status, the header fields and trailers the
// handler set that the replay rules keep, body) in the stored-response format the
// middleware keeps in Redis, commits that as the key's row with
// b.Commit, commits tx, and answers with exactly that response. The
// middleware then stores the very bytes that were committed, so the
// client, replays from Redis, and replays from PostgreSQL after Redis
// forgot the key all get the same response, byte for byte.
//
// CommitResponse writes the answer itself, in every outcome, and ends tx
// (commit or rollback). After it returns, the response is sealed: further
// writes by the handler fail and header changes (trailers included) are
// not sent. It writes
// to the Guard's own writer, so response-writer middleware between the
// Guard and the handler does not see the response: put such middleware
// outside the Guard. Set the response's header fields on w before calling
// it. The outcomes (see the package documentation, "Recipes"):
//
//   - nil: the row and tx are committed; the response is sent and stored,
//     even if the handler panics afterwards (the panic is logged; with
//     http.ErrAbortHandler the response is stored and the connection cut;
//     after runtime.Goexit it is stored, and net/http closes the
//     connection without it).
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
//   - an error matching the request context's error (context.Canceled:
//     the client left before the commit): the transaction is rolled
//     back, and as for guard.ErrUnavailable the answer is 503, nothing is
//     stored and the key is released.
//   - an error matching guard.ErrMismatch: the key's row was committed for
//     another request; 422, nothing stored.
//   - any other error: 500 (ProblemStoreError), nothing stored.
//
// A status that releases the key (a 5xx, 408, 429 or 499: see
// Options.Store5xx) is not committed unless Options.Store5xx: tx is rolled
// back, the response is sent and the key released, as for any such
// response. A body
// over Options.MaxStoredResponse reaches the client, and the key keeps a
// marker (replays say the response was not kept), in both stores.
//
// Outside a guarded run (a method that is not guarded, an optional key
// left out) CommitResponse commits tx and writes the response to w; if
// the commit fails it answers 503.
func CommitResponse(w http.ResponseWriter, r *http.Request, tx *sql.Tx, b *backstop.Backstop, status int, body []byte) error {
	return httpcore.CommitResponse(w, r.Context(), r.URL.Path, tx, b, status, body)
}
