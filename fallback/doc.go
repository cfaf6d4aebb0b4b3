// Package fallback keeps a guard safe when its Redis store goes away.
//
// A Store wraps the primary guard.Store (Redis) in a circuit breaker and
// bounds every call to it by a timeout. It reaches the primary only through
// guard.Store, guard.StepStore and the optional guard.DeadlineStore, so the
// primary may be wrapped (promx's Metrics.Store, an otelx Tracer's Store) as long
// as the wrapper forwards the interfaces it should keep. The breaker's
// state is reported as a State; the breaker itself
// (github.com/sony/gobreaker/v2) is an implementation detail.
// While the primary is unavailable, claims follow a Policy: FailClosed (the
// default) refuses them with guard.ErrUnavailable, Secondary claims them in
// another Store (the Postgres Store of package pgstore), FailOpen lets
// the effect run unguarded and logs a warning for each.
//
// # Switching back
//
// A key claimed or completed in the secondary during an outage is not run
// again through the primary when it returns. Three rules make it so:
//
//  1. A lease belongs to the store that issued it. The Store remembers the
//     tokens of leases it took in the secondary, and their holder's
//     Complete, Fail, Release and Extend go there, whatever the breaker
//     says later. A holder that claimed in the secondary and finishes after
//     the switch-back completes in the secondary. A holder of a primary
//     lease whose write the primary cannot take (it is out) writes to the
//     secondary instead when the secondary's record of the key bears its
//     token: with a primary wrapped by backstop.Wrap on the secondary's
//     tables, that record is its mark, so its Fail or Release ends the
//     mark's lease (claims in the secondary are not told the key is in
//     progress for a lease nobody holds) and its Complete is replayed.
//     While the breaker is open, the holder's later writes go to the
//     secondary at once; a write it took while the breaker stayed closed
//     (one call unanswered) is a one-off: the holder's next write goes to
//     the primary again (its lease there is extended, its steps kept
//     there).
//  2. Every claim the primary answers with Acquired is checked against the
//     secondary before it is returned: a record there may be this Store's,
//     or another process's (a replica whose breaker opened when this one's
//     did not, a process before a restart). If the secondary has no record, the
//     primary's lease stands; so it does when the record is this claim's
//     own (a primary wrapped by backstop.Wrap marks its holder in the keys
//     table, which pgstore's Store shares). If it holds the key completed, the result is
//     copied into the primary under the lease just taken (so later retries
//     replay from Redis) and the claim answers Replay. If it holds the key
//     with another fingerprint, the claim answers Mismatch. If it holds it
//     pending or failed, the primary's claim is released and the claim is
//     made in the secondary, whose own atomic claim answers: InProgress for
//     a live holder, a recovery (fence+1) for an abandoned one, Exhausted.
//     If the secondary cannot be read, the claim is released and refused
//     with ErrUnavailable for as long as a record this Store wrote there
//     may live (its lease and TTL, counted from the last write this Store
//     made there, an extension included; see ConsultUntil and
//     ConsultSecondary): an unknown answer never runs the effect. Outside
//     that window the primary's lease stands, and the secondary is not
//     asked again for OpenTimeout: it is no dependency of a primary that
//     answers. A claim the primary answers Exhausted is checked too (its
//     last holder there died, and a retry may have completed the key in
//     the secondary during an outage): a key the secondary holds completed
//     with the same fingerprint answers Replay; any other record leaves
//     the answer Exhausted, and a secondary that cannot be read refuses
//     it as above.
//  3. Claims are sent to the secondary only while the breaker is open, and
//     the check of rule 2 first waits for every secondary claim already
//     sent to finish. So a check cannot read the secondary before a claim
//     that was routed there earlier has been written. While the breaker is
//     half-open, claims beyond its probes wait for the probes' verdict (at
//     most Options.Timeout, then ErrUnavailable) instead of going to the
//     secondary, where they could race a probe's check.
//
// What a fallback cannot do, and the SQL backstop (a unique row written in
// the business transaction) must: a key completed in Redis before the
// outage is unknown to the secondary, so a retry during the outage runs it
// there again; a holder that claimed in Redis and is still running when
// Redis dies cannot stop a retry from claiming in the secondary; a Redis
// that comes back empty has forgotten what it held. An outage is what the
// breaker counts, not what Redis knows: a Redis that answers late (a burst
// that keeps calls waiting for the client's pool past Options.Timeout) or
// refuses writes (OOM under noeviction) opens it too, and while it is open
// retries of keys Redis holds completed run again in the secondary (seen
// in a storm of three replicas: a burst of retries after recovery opened
// two breakers again, and a hundred keys ran twice); under FailClosed they
// are refused with guard.ErrUnavailable, replays Redis could still answer
// among them, until a probe after OpenTimeout finds Redis answering. The two stores number
// fences separately, so a key's fence can go down when it moves between
// them; Backstop.Commit's unique row, not fence order, keeps the effect
// single across an outage. Processes over one primary and one secondary
// (replicas) each have a breaker of their own: while one's is open and
// another's closed, the same key can be claimed in both stores at once and
// run twice, overlapping (seen in the moment Redis came back, over three
// replicas: one still in the secondary, the others back on Redis). Only a
// store both claims reach keeps that single: put the fallback over
// backstop.Wrap on the secondary's tables (a secondary claim finds the
// mark Wrap makes for a Redis claim, and Wrap's claim finds the secondary's
// record). A process that missed an outage others wrote to the secondary
// checks their records as any claim does, but lets the primary's claim
// stand while the secondary cannot be read: call ConsultSecondary at
// start-up to refuse instead.
//
// # Bounding the primary's calls
//
// Every primary call runs on a goroutine of its own so that the bound holds
// whatever the client does with the context; a call abandoned at its bound
// finishes in the background, and a claim it takes there (its caller was
// answered ErrUnavailable) is released, not left pending for a lease
// nobody holds. A primary that says its calls end by their context's
// deadline (guard.DeadlineStore: a RedisStore whose go-redis client has
// ContextTimeoutEnabled, or a wrapper that forwards its answer) has its
// reads and holders' writes called on the caller's goroutine instead,
// which saves a goroutine and a channel per call. Its claims still get a
// goroutine, and are not cut off at the bound: the claim runs to the
// lease's first deadline, so that one Redis applies after its caller gave
// up is heard and released (a client cut off at the bound closes the
// connection, and the claim, still queued in Redis, is taken with nobody
// to hear it).
package fallback
