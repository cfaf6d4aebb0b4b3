package guard_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// heldConn is a connection to Redis whose replies to claims sent while
// its gate is closed are held back until it opens: the server has run
// the claims, their answers are on the way. It honours read deadlines as
// the socket would.
type heldConn struct {
	net.Conn
	gate *replyGate
	mu   sync.Mutex
	rd   time.Time
	held chan struct{} // closed when its replies may pass; nil: they pass
}

// replyGate holds back the replies of every heldConn made with it while
// held is open (nil: replies pass).
type replyGate struct {
	mu   sync.Mutex
	held chan struct{}
}

func (g *replyGate) hold() {
	g.mu.Lock()
	g.held = make(chan struct{})
	g.mu.Unlock()
}

func (g *replyGate) open() {
	g.mu.Lock()
	if g.held != nil {
		close(g.held)
		g.held = nil
	}
	g.mu.Unlock()
}

func (c *heldConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.rd = t
	c.mu.Unlock()
	return c.Conn.SetDeadline(t)
}

func (c *heldConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.rd = t
	c.mu.Unlock()
	return c.Conn.SetReadDeadline(t)
}

// Write marks the connection's next replies held when it sends claims
// (SET … NX) while the gate is closed.
func (c *heldConn) Write(p []byte) (int, error) {
	if bytes.Contains(bytes.ToLower(p), []byte("\r\nnx\r\n")) {
		c.gate.mu.Lock()
		held := c.gate.held
		c.gate.mu.Unlock()
		c.mu.Lock()
		c.held = held
		c.mu.Unlock()
	}
	return c.Conn.Write(p)
}

func (c *heldConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	held, rd := c.held, c.rd
	c.mu.Unlock()
	if held != nil {
		var expired <-chan time.Time
		if !rd.IsZero() && !rd.After(time.Now()) {
			return c.Conn.Read(p) // a deadline passed: the socket's own answer
		}
		if !rd.IsZero() {
			t := time.NewTimer(time.Until(rd))
			defer t.Stop()
			expired = t.C
		}
		select {
		case <-held:
		case <-expired:
			return 0, os.ErrDeadlineExceeded
		}
	}
	return c.Conn.Read(p)
}

// A batch whose caller's context ends at its deadline while the claims
// are on their way waits for their answers (up to the lease's first
// deadline) and releases the keys they took, as it does for a
// cancellation: the claims' context, which does not end with the
// caller's, does not report the caller's deadline either, so a client
// that sets its socket deadlines from it (go-redis with
// ContextTimeoutEnabled) does not give up on the answers then and leave
// the keys pending until their leases run out.
func TestDoBatchDeadlineDuringClaims(t *testing.T) {
	addr := testenv.RedisAddr(t)
	gate := &replyGate{}
	c := redis.NewClient(&redis.Options{
		Addr: addr, ContextTimeoutEnabled: true,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &heldConn{Conn: conn, gate: gate}, nil
		},
	})
	t.Cleanup(func() { gate.open(); _ = c.Close() })
	s := guardenv.StoreOn(t, c, guard.RedisOptions{})
	g := guard.New(s, guard.Options{Lease: 10 * time.Second})
	items := batchItems("deadline-claims", 3)

	ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
	defer cancel()
	gate.hold()
	done := make(chan []guard.BatchResult, 1)
	go func() {
		done <- g.DoBatch(ctx, items, func(context.Context, int, guard.Lease) ([]byte, error) {
			t.Error("an effect ran after its batch's deadline")
			return nil, nil
		}, guard.BatchOptions{})
	}()
	// The server has taken every key; their answers are held back until
	// half a second after the caller's deadline, and the batch must wait
	// for them.
	direct := testenv.Redis(t)
	testenv.WaitFor(t, 10*time.Second, "the claims to reach the server", func() bool {
		n, err := direct.Exists(bg, keyNames(s, items)...).Result()
		return err == nil && n == int64(len(items))
	})
	<-ctx.Done()
	var res []guard.BatchResult
	select {
	case res = <-done:
		t.Error("DoBatch returned before the claims' answers came")
	case <-time.After(500 * time.Millisecond):
		gate.open()
		res = <-done
	}
	for i, r := range res {
		if !errors.Is(r.Err, context.DeadlineExceeded) || errors.Is(r.Err, guard.ErrUnavailable) {
			t.Errorf("item %d: %v, want the caller's deadline (not run)", i, r.Err)
		}
		if _, err := g.Get(bg, items[i].Key); !errors.Is(err, guard.ErrNotFound) {
			t.Errorf("item %d: record %v, want released", i, err)
		}
	}
}

func keyNames(s *guard.RedisStore, items []guard.BatchItem) []string {
	names := make([]string, len(items))
	for i, it := range items {
		names[i] = s.Name(it.Key)
	}
	return names
}
