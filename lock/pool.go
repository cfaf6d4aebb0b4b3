package lock

import (
	"context"
	"time"

	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	goredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

// pool is redsync's go-redis pool with an acquisition that is safe to
// send twice. A client re-sends a command whose answer it lost
// (go-redis's MaxRetries), and a SET NX sent again finds the attempt's
// own value and answers "not set": redsync then counted the node as
// another holder's (ErrTaken) and deleted the keys it took, and Singleton
// skipped a round that no instance ran.
type pool struct{ redsyncredis.Pool }

func newPool(c redis.UniversalClient) pool { return pool{goredis.NewPool(c)} }

func (p pool) Get(ctx context.Context) (redsyncredis.Conn, error) {
	conn, err := p.Pool.Get(ctx)
	if err != nil {
		return nil, err
	}
	return poolConn{conn}, nil
}

type poolConn struct{ redsyncredis.Conn }

// SetNX is SET NX PX, and a key found holding value counts as taken by
// the caller: value is unique to one Obtain, so the key holds it only
// because this attempt's SET landed (an answer lost, the SET sent
// again). Its expiry then runs from that first SET, sent after the
// attempt began, from which the lock's validity is reckoned.
func (c poolConn) SetNX(name, value string, expiry time.Duration) (bool, error) {
	ok, err := c.Conn.SetNX(name, value, expiry)
	if err != nil || ok {
		return ok, err
	}
	v, err := c.Conn.Get(name)
	return err == nil && v == value, nil
}
