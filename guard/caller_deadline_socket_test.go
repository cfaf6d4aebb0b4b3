package guard_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// commandLog logs the commands a client processed.
type commandLog struct {
	mu    sync.Mutex
	names []string
}

func (l *commandLog) DialHook(next redis.DialHook) redis.DialHook { return next }
func (l *commandLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		l.mu.Lock()
		l.names = append(l.names, cmd.Name())
		l.mu.Unlock()
		return err
	}
}
func (l *commandLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (l *commandLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.names
	l.names = nil
	return n
}

// TestCallerDeadlineOnTheSocketIsNotALostAnswer: 4ceb28e stopped taking a
// claim cut off by its caller's context for one whose answer was lost
// (design.md: "nor a claim the guard's own bound or its caller's context
// ended"), but it asks only the error: errors.Is(err,
// context.DeadlineExceeded). A go-redis client with ContextTimeoutEnabled
// (what RedisStore.HonoursDeadline asks for) sets the caller's deadline
// as the socket's read deadline, and without retries (MaxRetries -1,
// go-redis's way to send a script at most once) the claim fails with the
// socket's "i/o timeout" (os.ErrDeadlineExceeded, not the context's).
// unheard takes it for a lost answer: the guard sends a release and holds
// the caller up to unheardBound (1 s) past its 100 ms deadline, on a
// server that is not answering: what 4ceb28e meant to end.
func TestCallerDeadlineOnTheSocketIsNotALostAnswer(t *testing.T) {
	srv := testenv.StartRedis(t)
	admin := srv.Client()
	for _, call := range []string{"Claim", "Do"} {
		t.Run(call, func(t *testing.T) {
			c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
			defer c.Close()
			cmds := &commandLog{}
			c.AddHook(cmds)
			s := guard.NewRedisStore(c, guard.RedisOptions{Prefix: "rr3:"})
			g := guard.New(s, guard.Options{Lease: 10 * time.Second})
			key := guard.Key{Scope: "rr3", ID: call}
			if err := c.Ping(bg).Err(); err != nil { // a warm connection
				t.Fatal(err)
			}
			cmds.take()
			// The server stops answering for 1.5 s (a stall: a slow fork, a
			// long script); the caller's deadline is 100 ms.
			if err := admin.Do(bg, "client", "pause", 1500, "all").Err(); err != nil {
				t.Fatal(err)
			}
			defer time.Sleep(1600 * time.Millisecond) // the pause ends before the next round
			ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
			defer cancel()
			start := time.Now()
			err := claimVia(ctx, g, call, key)
			took := time.Since(start)
			sent := cmds.take()
			t.Logf("%s: %v after %s; commands %v", call, err, took.Round(time.Millisecond), sent)
			if err == nil {
				t.Fatal("the claim succeeded")
			}
			if len(sent) > 1 {
				t.Errorf("%s cut off by its caller's deadline sent %v: a release after the claim, as for a lost answer", call, sent)
			}
			if took > 500*time.Millisecond {
				t.Errorf("%s returned %s after it was called with a 100 ms deadline (it waited for that release)", call, took.Round(time.Millisecond))
			}
		})
	}
}
