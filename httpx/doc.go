// Package httpx makes net/http handlers idempotent with a guard.Guard, and
// gives clients a transport that retries safely.
//
// Guard is middleware for any router (ServeMux, chi, gorilla/mux, ...). It
// follows the IETF draft "The Idempotency-Key HTTP Header Field" and
// Stripe: the first request with a key runs the handler and its response is
// stored; a repeat with the same key and the same request gets the stored
// response, byte for byte, with "Idempotent-Replayed: true", and the
// handler does not run again. A repeat while the first still runs gets 409
// with Retry-After (or, with Options.Wait, waits for the first's response);
// a repeat with another request under the same key gets 422. Every
// response the middleware writes itself is an RFC 9457
// application/problem+json document with a stable type URI (the Problem*
// constants).
//
// # Keys are kept per caller
//
// A key is scoped by the caller, the method and the route, so one caller's
// key never replays another caller's response. Building a Guard means
// choosing how the caller is named: Options.Tenant (TenantFromContext reads
// what an authentication middleware stored; TenantFromJWT the subject of
// verified JWT claims), or Options.SingleCaller for a service one caller
// owns. Guard panics without a choice. The caller is never derived from the
// credential itself: a client that refreshes its token between two retries
// is replayed, not run again.
//
// # Where the key comes from
//
// Options.Key chooses, per Guard and so per route or route group: the
// Idempotency-Key header (the default); a field of the JSON body,
// KeyFromBody("/order_id") (an RFC 6901 pointer), which behaves as a
// header key does (422 for another body under the same key, 400 when it
// is missing); or ComputedKey, for clients that send no key, which
// digests the method, route, path, query, Content-Type, chosen header
// fields and body, so a retry of the same request replays. A computed key
// is wrong where a client sends the same request twice on purpose: two
// identical orders within the TTL become one. A key the client does send
// in the header wins over a computed one.
//
// # The inventory
//
// The handler a Guard returns reports its policy (inventory.Guarded): how
// the key is required, where it comes from, whose keys are kept apart,
// the TTL. The inventory package and its chiwalk and muxwalk subpackages
// find it on each route and list unguarded unsafe routes as gaps;
// Options.CallerScope says whether Tenant names a tenant or a user there.
//
// # What a replay carries
//
// The stored status and body, the header fields the handler set or
// changed, and its trailers; fields that middleware outside the Guard set
// keep their values of the moment (a request id stays the new request's).
// Hop-by-hop fields
// are never stored; DefaultReplayHeader leaves out Set-Cookie,
// Authentication-Info and Proxy-Authentication-Info too, and
// Options.ReplayHeader can change that choice.
//
// # Recipes: a guarded handler with a SQL backstop
//
// Redis can forget a key (a FLUSHALL, a failover, a restart without
// persistence). With package backstop, the key's row is written in the business
// transaction, and a guard over backstop.Wrap answers from
// PostgreSQL when Redis forgot. The row must hold what the client receives,
// so a replay from PostgreSQL is the original response: end the handler
// with CommitResponse, which commits the response in the stored-response
// format with the business transaction and answers with it:
//
//	func charge(w http.ResponseWriter, r *http.Request) {
//		tx, err := db.BeginTx(r.Context(), nil)
//		if err != nil {
//			w.WriteHeader(http.StatusServiceUnavailable) // 5xx: the key is released
//			return
//		}
//		defer tx.Rollback()
//		lease, _, _ := httpx.ClaimFrom(r.Context())
//		id, err := insertCharge(r.Context(), tx, lease.Fence)
//		if err != nil {
//			w.WriteHeader(http.StatusInternalServerError) // released, retried
//			return
//		}
//		w.Header().Set("Content-Type", "application/json")
//		w.Header().Set("Location", "/charges/"+id)
//		err = httpx.CommitResponse(w, r, tx, backstop, http.StatusCreated, body(id))
//		// The answer is written whatever err says; log err if you like.
//	}
//
// What CommitResponse does in each outcome, and why:
//
//   - Committed (nil): the charge, the key's row and the response are
//     committed together; the response goes out and Redis stores the same
//     bytes, even if the handler panics afterwards (the money moved: a
//     500 would read as a failed payment). After Redis forgets the key, the next request is answered
//     from PostgreSQL: the same status, header fields and body, with
//     Idempotent-Replayed: true, and Redis learns it again.
//   - backstop.ErrAlreadyCommitted: the key's effect was committed
//     before, but Redis had forgotten it and this request ran the handler
//     again. The transaction is rolled back (no second charge) and the
//     stored response is answered, with its own status (a 201 stays a
//     201), header fields and body, and Idempotent-Replayed: true.
//   - backstop.ErrStaleFence (or the lease was lost): another request
//     took the key over (its lease is newer) while this one ran. The
//     transaction is rolled back and the answer is 409 (InFlightStatus)
//     with Retry-After: the key is in progress elsewhere, which is what 409
//     says, and clients (NewClient among them) retry it within a second. A
//     2xx or 4xx would tell the client something that did not happen, and
//     a 500 is not retried by most clients. The 409 is never stored, even
//     with Store5xx: the retry gets the response of the request that holds
//     the key.
//   - The backstop unreachable (guard.ErrUnavailable): the transaction is
//     rolled back (or its COMMIT's outcome is unknown); the answer is 503
//     with Retry-After, nothing is stored, the key is released. The retry
//     finds the committed row and replays it, or runs the handler again.
//     When PostgreSQL cannot be reached at claim time, Guarded fails
//     closed: 503 before the handler runs.
//
// A write to the store that would end a claim (storing the response,
// releasing the key) is retried for up to 2 s while the store cannot be
// reached, and the key is released if the response cannot be stored, so a
// key is not left pending for a whole lease after Redis comes back.
//
// # The client
//
// Transport is the client side: it gives POST and PATCH requests a key and
// retries them with that same key, asking again about a key in flight
// within a second; a replayed answer (Idempotent-Replayed: true) is the
// key's stored one, and is returned at once.
package httpx
