package lock

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// raiseScript sets a fence counter to ARGV[1] if it is below it, and
// returns 1; it returns 0, and leaves the counter, if it is already at
// ARGV[1] or above: another round raised it to that number meanwhile.
var raiseScript = redis.NewScript(`
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local v = tonumber(ARGV[1])
if cur < v then
  redis.call('SET', KEYS[1], ARGV[1])
  return 1
end
return 0
`)

// fenceSuffix ends the key of a fence counter; no lock name may end so.
const fenceSuffix = ":fence"

// fenceKey is the Redis key of the fence counter of lock name.
func (l *Locker) fenceKey(name string) string { return l.opts.Prefix + name + fenceSuffix }

// fence takes the next fencing number of lock name, which the caller
// holds: it reads the counter on every node, and needs a quorum of
// answers; then raises the counter to their maximum plus one on every
// node, and needs a quorum of nodes to confirm that this round raised it,
// and none to answer that it held that number or more already. Any two
// quorums share a node, so the number is above every number handed out
// before, and no two rounds hand out the same one, even rounds of two
// holders at once (a broken lock), while nodes keep their counters: on
// the node their quorums share, only the first raises the counter to that
// number. A node the reads missed that answers the raise (the one node
// left with the last number after a restart, say) also stops the round,
// instead of the number being handed out again.
func (l *Locker) fence(ctx context.Context, name string) (int64, error) {
	key := l.fenceKey(name)
	ctx, cancel := context.WithTimeout(ctx, l.opTimeout())
	defer cancel()
	vals, err := l.onNodes(ctx, func(ctx context.Context, c redis.UniversalClient) (int64, error) {
		v, err := c.Get(ctx, key).Int64()
		if errors.Is(err, redis.Nil) {
			return 0, nil
		}
		return v, err
	})
	if err != nil {
		return 0, fmt.Errorf("%w: lock %q: read fence: %w", ErrUnavailable, name, err)
	}
	next := maxOf(vals) + 1
	ctx2, cancel2 := context.WithTimeout(context.WithoutCancel(ctx), l.opTimeout())
	defer cancel2()
	arg := strconv.FormatInt(next, 10)
	raised, err := l.onNodes(ctx2, func(ctx context.Context, c redis.UniversalClient) (int64, error) {
		return raiseScript.Run(ctx, c, []string{key}, arg).Int64()
	})
	if err != nil {
		return 0, fmt.Errorf("%w: lock %q: write fence: %w", ErrUnavailable, name, err)
	}
	if n := sum(raised); n < int64(len(raised)) {
		// Another round took this number (another holder has the lock
		// too, or a stalled one raised the counters), or a node the
		// reads missed had it already. The next attempt reads afresh.
		return 0, fmt.Errorf("%w: lock %q: %d of %d nodes that answered already held fence %d or more",
			ErrNotObtained, name, int64(len(raised))-n, len(raised), next)
	}
	return next, nil
}

// onNodes runs fn on every node at once and returns the results of those
// that answered, or an error if fewer than a quorum did.
func (l *Locker) onNodes(ctx context.Context, fn func(context.Context, redis.UniversalClient) (int64, error)) ([]int64, error) {
	type result struct {
		v   int64
		err error
	}
	ch := make(chan result, len(l.clients))
	for i, c := range l.clients {
		go func() {
			v, err := fn(ctx, c)
			if err != nil {
				err = fmt.Errorf("node #%d: %w", i, err)
			}
			ch <- result{v, err}
		}()
	}
	var (
		vals []int64
		errs []error
	)
	for range l.clients {
		r := <-ch
		if r.err != nil {
			errs = append(errs, r.err)
			continue
		}
		vals = append(vals, r.v)
	}
	if len(vals) < l.quorum {
		return nil, fmt.Errorf("%d of %d nodes answered: %w", len(vals), len(l.clients), errors.Join(errs...))
	}
	return vals, nil
}

func sum(vals []int64) int64 {
	var n int64
	for _, v := range vals {
		n += v
	}
	return n
}

func maxOf(vals []int64) int64 {
	var m int64
	for _, v := range vals {
		if v > m {
			m = v
		}
	}
	return m
}

type ctxKey struct{}

// FromContext returns the lock held by the Do, TryDo or Singleton whose
// function ctx was passed to (the innermost one), or nil.
func FromContext(ctx context.Context) *Lock {
	k, _ := ctx.Value(ctxKey{}).(*Lock)
	return k
}
