package guard

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// unheard reports whether a claim that failed with err may have been
// taken by the store all the same: the connection failed after the claim
// was sent, so its answer was lost (a read timeout shorter than the
// server's answer, a connection reset or closed under it; a database/sql
// driver's driver.ErrBadConn, which lib/pq returns for a connection that
// broke after the statement went out, a COMMIT among them). A refusal the
// server answered (OOM, READONLY, a corrupt record), a connection that
// never opened, and an error without a transport failure in it (a
// context that ended, a wrapper's own bound or circuit breaker, which
// see to their own claims) are not.
func unheard(err error) bool {
	if err == nil {
		return false
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		// A context that ended (its type is a net.Error with Timeout
		// true, as a socket's read timeout is: asked below, a caller's
		// deadline read as a lost answer, and cost a release and up to
		// unheardBound more of the caller's time).
		return false
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, driver.ErrBadConn)
}

// callerEnded reports whether ctx has ended or reached its deadline: a
// socket timeout set from that deadline (go-redis) can come back a moment
// before the context's own timer ends it.
func callerEnded(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// releaseUnheard releases the claim req made, whose answer was lost
// (unheard), by its owner token: a claim the store took frees the key,
// attempt uncounted, instead of holding it for a whole lease (and, at
// MaxAttempts, leaving it exhausted by an attempt whose effect never
// ran). The release compares the token, so it changes nothing when the
// claim took nothing. Best effort, and not observed (nobody heard of the
// claim): a claim still on its way after the release stays until its
// lease runs out, as an abandoned one. Bounded by unheardBound: the
// caller is waiting for its ErrUnavailable, and a store that lost one
// answer is likely to lose the release's too.
func (g *Guard) releaseUnheard(ctx context.Context, req ClaimRequest) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unheardBound)
	defer cancel()
	_ = g.store.Release(rctx, Lease{Key: req.Key, Token: req.Token})
}

// unheardBound bounds releaseUnheard's release: sent at once, it lands
// after the claim whose answer was lost whatever the bound, which only
// says how long the caller waits for the release's answer (and for
// go-redis's retries of it) on a store that has stopped answering.
const unheardBound = time.Second

// releaseUnheardBatch is releaseUnheard for the claims of a batch whose
// answers were lost: one WriteBatch of their releases, ws.
func (g *Guard) releaseUnheardBatch(ctx context.Context, bs BatchStore, ws []Write) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unheardBound)
	defer cancel()
	_ = bs.WriteBatch(rctx, ws)
}
