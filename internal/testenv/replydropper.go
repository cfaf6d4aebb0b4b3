package testenv

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// ReplyDropper is a TCP proxy in front of a Redis server that loses one
// answer when armed: the next request chunk a client sends that matches
// goes to the server, which runs it, and the connection is closed before
// the answer reaches the client (a network blip, a load balancer's idle
// cut). go-redis reads EOF and sends the command again on a new
// connection (its MaxRetries): the command runs twice.
type ReplyDropper struct {
	ln      net.Listener
	target  string
	match   atomic.Pointer[func([]byte) bool]
	dropped atomic.Int32
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
}

// NewReplyDropper starts a ReplyDropper in front of target, closed when
// the test ends.
func NewReplyDropper(t testing.TB, target string) *ReplyDropper {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &ReplyDropper{ln: ln, target: target}
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

// Addr is the proxy's address, for clients.
func (p *ReplyDropper) Addr() string { return p.ln.Addr().String() }

// Arm makes the next chunk a client sends that match reports true for
// lose its answer.
func (p *ReplyDropper) Arm(match func(chunk []byte) bool) { p.match.Store(&match) }

// Dropped is how many answers the proxy has lost.
func (p *ReplyDropper) Dropped() int { return int(p.dropped.Load()) }

func (p *ReplyDropper) accept() {
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
		replied := make(chan struct{}) // closed when the server answered the muted command
		p.wg.Add(2)
		go func() { // server → client, unless muted
			defer p.wg.Done()
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 && mute.Load() {
					close(replied) // it ran; its answer goes nowhere
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
		go func() { // client → server
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
				if err != nil { // EOF or a closed connection: end the server's side too
					_ = s.Close()
					return
				}
			}
		}()
	}
}
