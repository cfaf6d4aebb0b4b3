package guard

import "context"

// CallOptions change, for one call, what the Guard's Options set for
// every call. The zero value means "as the guard's Options": a field left
// zero takes the guard's value. Every call that claims takes them: DoWith
// and ClaimWith directly, DoBatch through BatchOptions, Wait through
// WaitOptions. They exist so that one Guard (one store, one observer, one
// lease policy) can serve callers with different limits, such as a
// consumer group that dead-letters after 3 attempts next to an HTTP route
// that never stops retrying, without building a second Guard.
type CallOptions struct {
	// MaxAttempts bounds how often a failing key is tried before this
	// call's claim returns ErrExhausted (*ExhaustedError). Zero takes the
	// guard's Options.MaxAttempts; a negative value means no limit for
	// this call, whatever the guard's.
	//
	// The limit is judged when a key is claimed, against the attempts the
	// record has counted so far: callers with different limits on the same
	// key each see their own (one with a limit of 3 is told ErrExhausted
	// where one without a limit recovers the key and tries a fourth time).
	MaxAttempts int
}

// maxAttempts is the attempt limit a claim made with c sends to the
// store: 0 means none.
func (c CallOptions) maxAttempts(guardMax int) int {
	switch {
	case c.MaxAttempts < 0:
		return 0
	case c.MaxAttempts > 0:
		return c.MaxAttempts
	default:
		return guardMax
	}
}

// DoWith is Do with call options: the same guarantees, with opts in
// force for this call's claim in place of the guard's Options. Do(ctx,
// key, fingerprint, fn) is DoWith(ctx, key, fingerprint, fn,
// CallOptions{}). A nil fn panics, as in Do, before the key is claimed.
func (g *Guard) DoWith(ctx context.Context, key Key, fingerprint string, fn Func, opts CallOptions) (Result, error) {
	if fn == nil {
		panic("guard.DoWith: nil Func")
	}
	return g.do(ctx, key, fingerprint, fn, opts)
}

// ClaimWith is Claim with call options: the same guarantees, with opts in
// force for this claim in place of the guard's Options. Claim(ctx, key,
// fingerprint) is ClaimWith(ctx, key, fingerprint, CallOptions{}).
func (g *Guard) ClaimWith(ctx context.Context, key Key, fingerprint string, opts CallOptions) (Outcome, error) {
	return g.claim(ctx, key, fingerprint, opts)
}
