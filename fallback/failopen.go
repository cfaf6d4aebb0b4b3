package fallback

import (
	"context"
	"errors"
	"strings"

	"github.com/idemguard/idemguard/guard"
)

// ErrReservedToken is returned by Claim for an owner token that begins
// with the prefix this package gives unguarded leases. Tokens made by
// guard.Guard never do.
var ErrReservedToken = errors.New("fallback: owner token uses a reserved prefix")

// openPrefix starts the token of every unguarded (FailOpen) lease. guard's
// tokens are upper-case base32 and never contain it.
const openPrefix = "fallback-open:"

// Unguarded reports whether lease was handed out by FailOpen: the key is
// recorded nowhere and a duplicate may run at the same time. Its Fence is 0.
func Unguarded(lease guard.Lease) bool { return strings.HasPrefix(lease.Token, openPrefix) }

// open lets a claim through unguarded, loudly.
func (s *Store) open(ctx context.Context, req guard.ClaimRequest, cause error) (guard.Outcome, error) {
	s.opts.Logger.WarnContext(ctx, "idemguard: primary store unavailable, running effect UNGUARDED (fail-open)",
		"key", req.Key.String(), "breaker", s.opts.Name, "cause", cause.Error())
	return guard.Outcome{Status: guard.Acquired, Lease: guard.Lease{
		Key: req.Key, Token: openPrefix + req.Token, Fence: 0, Attempt: 1,
	}}, nil
}
