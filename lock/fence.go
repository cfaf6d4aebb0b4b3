package lock

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// raiseScript sets the fence counter KEYS[1] to ARGV[1] if it is below
// it, records the round ARGV[2] that did so in KEYS[2], if given (for
// ARGV[3] ms),
// and returns 1; it returns 1 too, changing nothing, for the counter at
// ARGV[1] by this very round (its raise sent again: go-redis re-sends a
// command whose answer it lost). It returns 0, and leaves the counter, if
// it is already at ARGV[1] or above by another round's doing: another
// round raised it to that number meanwhile. It returns -1 if the counter
// is below ARGV[1] but the node refuses the write (full under noeviction,
// a replica): the node answered, and holds no number as high, but the
// round's number is not on it.
var raiseScript = redis.NewScript(`
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local v = tonumber(ARGV[1])
if cur == v and KEYS[2] and redis.call('GET', KEYS[2]) == ARGV[2] then
  return 1
end
if cur >= v then
  return 0
end
local r = redis.pcall('SET', KEYS[1], ARGV[1])
if type(r) == 'table' and r.err then
  return -1
end
if KEYS[2] then
  redis.pcall('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
end
return 1
`)

// fenceSuffix ends the key of a fence counter, roundSuffix the key of the
// round that last raised it; no lock name may end so.
const (
	fenceSuffix = ":fence"
	roundSuffix = ":fence:round"
)

// fenceKey is the Redis key of the fence counter of lock name.
func (l *Locker) fenceKey(name string) string { return l.opts.Prefix + name + fenceSuffix }

// roundKey is the Redis key of the round that last raised lock name's
// fence counter, in the counter's hash slot (a node may be a Cluster
// client): the counter's key and roundSuffix when the counter's key has a
// hash tag, else the counter's key as the tag. "" when neither is in its
// slot (a key with a '}' but no tag): the raise then goes without it.
func (l *Locker) roundKey(name string) string {
	key := l.fenceKey(name)
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return l.opts.Prefix + name + roundSuffix // the same tag
		}
	}
	if strings.IndexByte(key, '}') >= 0 {
		return ""
	}
	return "{" + key + "}:round"
}

// fence takes the next fencing number of lock name, which the caller
// holds: it reads the counter on every node, and needs a quorum of
// answers; then raises the counter to their maximum plus one on every
// node. The round hands the number out only if a quorum of nodes confirm
// that this round raised their counter to it, none answers that it held
// that number or more already, and every node whose counter the round
// read answers the raise (a node refusing writes, -1, answers). Any two
// quorums share a node, so the number is above every number handed out
// before, and no two rounds hand out the same one, even rounds of two
// holders at once (a broken lock), while nodes keep their counters: on
// the node their quorums share, only the first raises the counter to that
// number. After one node restarted empty, two rounds can share only that
// node, so each must have missed the node holding the other's number: a
// node the reads missed that answers the raise holding the number (the
// one node left with the last number, say) stops the round, and a node
// whose counter was read must take the raise, as it may hold the other
// round's number by then. What is left is a node that answers neither
// call of a round (or refuses the raise, then takes the other round's):
// a second fault.
func (l *Locker) fence(ctx context.Context, name string) (int64, error) {
	key := l.fenceKey(name)
	ctx, cancel := context.WithTimeout(ctx, l.opTimeout())
	defer cancel()
	reads, err := l.onNodes(ctx, func(ctx context.Context, c redis.UniversalClient) (int64, error) {
		v, err := c.Get(ctx, key).Int64()
		if errors.Is(err, redis.Nil) {
			return 0, nil
		}
		return v, err
	})
	if err != nil {
		return 0, fmt.Errorf("%w: lock %q: read fence: %w", ErrUnavailable, name, err)
	}
	var next int64
	for _, r := range reads {
		if r.err == nil && r.v > next {
			next = r.v
		}
	}
	next++
	ctx2, cancel2 := context.WithTimeout(context.WithoutCancel(ctx), l.opTimeout())
	defer cancel2()
	arg, round, keys := strconv.FormatInt(next, 10), rand.Text(), []string{key}
	if rk := l.roundKey(name); rk != "" {
		keys = append(keys, rk)
	}
	raises, err := l.onNodes(ctx2, func(ctx context.Context, c redis.UniversalClient) (int64, error) {
		return raiseScript.Run(ctx, c, keys, arg, round, max(l.opts.Expiry.Milliseconds(), 1)).Int64()
	})
	if err != nil {
		return 0, fmt.Errorf("%w: lock %q: write fence: %w", ErrUnavailable, name, err)
	}
	var (
		took, held int
		missed     []error
	)
	for i, r := range raises {
		switch {
		case r.err != nil:
			if reads[i].err == nil {
				missed = append(missed, r.err)
			}
		case r.v == 1:
			took++
		case r.v == 0:
			held++
		}
	}
	switch {
	case held > 0:
		// Another round took this number (another holder has the lock
		// too, or a stalled one raised the counters), or a node the
		// reads missed had it already. The next attempt reads afresh.
		return 0, fmt.Errorf("%w: lock %q: %d of %d nodes already held fence %d or more",
			ErrNotObtained, name, held, len(raises), next)
	case len(missed) > 0:
		// A node whose counter was read may have taken another round's
		// number since: only its answer to the raise would tell.
		return 0, fmt.Errorf("%w: lock %q: write fence %d: nodes whose counter was read did not answer: %w",
			ErrUnavailable, name, next, errors.Join(missed...))
	case took < l.quorum:
		return 0, fmt.Errorf("%w: lock %q: fence %d written on %d of %d nodes (the others refused writes or did not answer)",
			ErrUnavailable, name, next, took, len(raises))
	}
	return next, nil
}

// nodeResult is one node's answer in onNodes: its value, or err if it
// did not answer.
type nodeResult struct {
	v   int64
	err error
}

// onNodes runs fn on every node at once and returns every node's result
// (in the order of the nodes), or an error if fewer than a quorum
// answered.
func (l *Locker) onNodes(ctx context.Context, fn func(context.Context, redis.UniversalClient) (int64, error)) ([]nodeResult, error) {
	type indexed struct {
		i int
		nodeResult
	}
	ch := make(chan indexed, len(l.clients))
	for i, c := range l.clients {
		go func() {
			v, err := fn(ctx, c)
			if err != nil {
				err = fmt.Errorf("node #%d: %w", i, err)
			}
			ch <- indexed{i, nodeResult{v, err}}
		}()
	}
	res := make([]nodeResult, len(l.clients))
	var (
		answered int
		errs     []error
	)
	for range l.clients {
		r := <-ch
		res[r.i] = r.nodeResult
		if r.err != nil {
			errs = append(errs, r.err)
			continue
		}
		answered++
	}
	if answered < l.quorum {
		return nil, fmt.Errorf("%d of %d nodes answered: %w", answered, len(l.clients), errors.Join(errs...))
	}
	return res, nil
}

type ctxKey struct{}

// FromContext returns the lock held by the Do, TryDo or Singleton whose
// function ctx was passed to (the innermost one), or nil.
func FromContext(ctx context.Context) *Lock {
	k, _ := ctx.Value(ctxKey{}).(*Lock)
	return k
}
