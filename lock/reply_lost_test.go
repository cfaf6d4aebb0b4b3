package lock_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/lock"
)

// replyDropper is a TCP proxy in front of one Redis node. Once armed with
// a match, the next request chunk the client sends that matches is
// delivered to the node, which runs it, and then the connection is closed
// before the node's reply reaches the client: a connection dropped after
// the command landed (a network blip, an LB idle cut). go-redis reads EOF
// and, with NewNodes' MaxRetries 1, sends the command again on a new
// connection. It drops one reply per arming.
type replyDropper struct {
	ln      net.Listener
	target  string
	match   atomic.Pointer[func([]byte) bool]
	dropped atomic.Int32
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
}

func newReplyDropper(t *testing.T, target string) *replyDropper {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &replyDropper{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *replyDropper) Addr() string { return p.ln.Addr().String() }

func (p *replyDropper) arm(match func([]byte) bool) { p.match.Store(&match) }

func (p *replyDropper) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		var mute atomic.Bool
		replied := make(chan struct{}) // closed when the node answered a muted command
		p.wg.Add(2)
		go func() { // node → client, unless muted
			defer p.wg.Done()
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 && mute.Load() {
					close(replied) // the node ran it; its answer goes nowhere
					return
				}
				if n > 0 {
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					_ = c.Close()
					return
				}
			}
		}()
		go func() { // client → node
			defer p.wg.Done()
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					chunk := buf[:n]
					if m := p.match.Load(); m != nil && (*m)(chunk) && p.match.CompareAndSwap(m, nil) {
						mute.Store(true)
						_, _ = s.Write(chunk)
						select {
						case <-replied:
						case <-time.After(5 * time.Second):
						}
						p.dropped.Add(1)
						_ = c.Close()
						_ = s.Close()
						return
					}
					if _, werr := s.Write(chunk); werr != nil {
						return
					}
				}
				if err != nil { // io.EOF or a closed conn: end the node's side too
					_ = s.Close()
					return
				}
			}
		}()
	}
}

// proxiedRedlock returns a proxy in front of each shared Redlock node and
// NewNodes clients of the proxies.
func proxiedRedlock(t *testing.T) ([]*replyDropper, []redis.UniversalClient) {
	t.Helper()
	addrs := testenv.List(t, testenv.EnvRedlock)
	proxies := make([]*replyDropper, len(addrs))
	paddrs := make([]string, len(addrs))
	for i, a := range addrs {
		proxies[i] = newReplyDropper(t, a)
		paddrs[i] = proxies[i].Addr()
	}
	return proxies, closing(t, lock.NewNodes(paddrs...))
}

// isReleaseOf matches redsync's release script (EVALSHA of deleteScript)
// on key.
func isReleaseOf(key string) func([]byte) bool {
	return func(b []byte) bool {
		return bytes.Contains(b, []byte("e950836ed1e694540c503ef9972b8de518044d3b")) && bytes.Contains(b, []byte(key))
	}
}

// isAcquireOf matches the first command on key: an attempt's acquisition
// (a SET NX, or the script the Locker sends for it).
func isAcquireOf(key string) func([]byte) bool {
	return func(b []byte) bool { return bytes.Contains(b, []byte(key)) }
}

// TestReleaseSentTwiceNotLost: Do's fn returned nil and held the lock
// throughout; the release's deletions landed on the nodes but the
// connections dropped before the answers came back, so go-redis sent
// each again. The second run found the key gone (redsync's
// ErrLockAlreadyExpired), which was counted as expired: Do returned
// ErrLost ("fn's work may have overlapped another holder's") though
// nothing overlapped. Two of three nodes sufficed.
func TestReleaseSentTwiceNotLost(t *testing.T) {
	for _, drop := range []int{2, 3} {
		t.Run(map[int]string{2: "2 of 3 replies dropped", 3: "3 of 3 replies dropped"}[drop], func(t *testing.T) {
			prefix := testenv.Prefix(t)
			proxies, nodes := proxiedRedlock(t)
			l := newLocker(t, nodes, lock.Options{Prefix: prefix, Expiry: 10 * time.Second})
			// Warm up: the release script is then cached on every node
			// (EVALSHA answers at once, no NOSCRIPT / EVAL fallback).
			if err := l.Do(bg, "warm", func(context.Context) error { return nil }); err != nil {
				t.Fatal(err)
			}
			key := prefix + "pay"
			err := l.Do(bg, "pay", func(ctx context.Context) error {
				for _, p := range proxies[:drop] {
					p.arm(isReleaseOf(key))
				}
				return nil
			})
			var dropped int32
			for _, p := range proxies {
				dropped += p.dropped.Load()
			}
			if dropped != int32(drop) {
				t.Fatalf("the proxies dropped %d release replies, want %d (Do: %v)", dropped, drop, err)
			}
			for i, c := range nodes {
				if n, _ := c.Exists(bg, key).Result(); n != 0 {
					t.Fatalf("node %d still holds the key after Do", i)
				}
			}
			if err != nil {
				t.Fatalf("Do whose fn returned nil with the lock held throughout (only the release's replies were lost, "+
					"go-redis re-sent the deletions) = %v (ErrLost: %v), want nil", err, errors.Is(err, lock.ErrLost))
			}
		})
	}
}

// TestSingletonRunsWhenItsAcquisitionIsSentTwice: a Singleton call whose
// acquisitions landed on every node but whose answers were lost to
// dropped connections: go-redis sent each again, and a SET NX sent again
// found the caller's own value and answered "not set". redsync reported
// every node taken, Singleton took that for another instance running the
// job and skipped, and no instance ran it that round.
func TestSingletonRunsWhenItsAcquisitionIsSentTwice(t *testing.T) {
	prefix := testenv.Prefix(t)
	proxies, nodes := proxiedRedlock(t)
	l := newLocker(t, nodes, lock.Options{Prefix: prefix, RetryDelay: 20 * time.Millisecond})
	// Warm up: the scripts are then cached on every node (the armed
	// command is the acquisition itself, not a NOSCRIPT answer).
	if err := l.Do(bg, "warm", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	key := prefix + "payout"
	for _, p := range proxies {
		p.arm(isAcquireOf(key))
	}
	var runs atomic.Int32
	err := lock.Singleton(l, "payout", func(context.Context) error { runs.Add(1); return nil })(bg)
	var dropped int32
	for _, p := range proxies {
		dropped += p.dropped.Load()
	}
	if dropped != int32(len(proxies)) {
		t.Fatalf("the proxies dropped %d SET replies, want %d (Singleton: %v)", dropped, len(proxies), err)
	}
	for i, c := range nodes {
		if n, _ := c.Exists(bg, key).Result(); n != 0 {
			t.Fatalf("node %d holds the key: another holder?", i)
		}
	}
	if err != nil || runs.Load() != 1 {
		t.Fatalf("Singleton with no other instance (its own SETs' replies lost and re-sent) = %v, job ran %d times; "+
			"want the job run once", err, runs.Load())
	}
}
