package guard

// DeadlineStore is an optional interface of a Store that can tell whether
// its calls end by their context's deadline. A wrapper around a Store
// (promx's Metrics.Store, an otelx Tracer's Store, one of your own) should
// implement it by asking the Store it wraps, and answer false when that
// Store does not implement it.
//
// fallback.Store uses it to run the primary's calls on the caller's
// goroutine when they need no goroutine of their own to be bounded.
type DeadlineStore interface {
	Store
	// HonoursDeadline reports whether every call of the store returns no
	// later than its context's deadline (give or take scheduling), whether
	// or not its server answers. false means it is not known: a call may
	// block past the deadline (a socket read without a timeout).
	HonoursDeadline() bool
}
