// Package pgproxy is a test helper: a TCP proxy between database/sql and
// PostgreSQL that loses the replies of chosen statements after they
// committed, to test what a caller makes of an outcome it cannot know.
// Only tests import it.
package pgproxy

import (
	"bytes"
	"database/sql"
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"

	_ "github.com/lib/pq" // the "postgres" driver New opens
)

// Proxy is a TCP proxy between the database/sql driver and PostgreSQL
// that can lose the replies of a statement: armed with a piece of SQL, it
// forwards every statement whose text contains it, lets the server run it
// and commit (it reads the server's replies up to ReadyForQuery), then
// closes both connections without passing a byte of that reply on. The
// client sees its connection die after the statement committed: the reply
// lost on the way back. (database/sql sends a statement made outside a
// transaction again on another connection when lib/pq reports the first
// one bad, up to three times in all; the proxy loses those replies too,
// until KeepReplies.)
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	marker []byte // armed: the SQL whose replies are lost; nil: forward all
	once   bool   // disarm after the first statement armed
	cut    atomic.Int64
	wg     sync.WaitGroup
	conns  map[net.Conn]struct{}
	closed bool
}

// New starts a proxy to PostgreSQL and returns a *sql.DB whose
// connections go through it to the database dsn names (a lib/pq URL, as
// testenv.Postgres returns). Both are closed when the test ends.
func New(t testing.TB, dsn string) (*Proxy, *sql.DB) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: u.Host, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	u.Host = ln.Addr().String()
	db, err := sql.Open("postgres", u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = db.Close()
		p.close()
	})
	return p, db
}

// LoseReplies arms the proxy: from now on, every statement whose SQL
// contains sql runs and commits, and its client's connection dies before
// the reply.
func (p *Proxy) LoseReplies(sql string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marker, p.once = []byte(sql), false
}

// LoseReply arms the proxy for one statement: the next statement whose SQL
// contains sql runs and commits, and its client's connection dies before
// the reply; later ones (database/sql's own retry among them) go through.
func (p *Proxy) LoseReply(sql string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marker, p.once = []byte(sql), true
}

// KeepReplies disarms the proxy: replies reach the client again.
func (p *Proxy) KeepReplies() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marker = nil
}

// Cuts returns how many replies the proxy has lost.
func (p *Proxy) Cuts() int64 { return p.cut.Load() }

func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	_ = p.ln.Close()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range cs {
			_ = c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		if !p.track(client, server) {
			return
		}
		var armed atomic.Bool
		p.wg.Add(2)
		go p.up(client, server, &armed)
		go p.down(server, client, &armed)
	}
}

// up forwards the client's bytes to the server, arming the connection
// when they carry the marker's SQL.
func (p *Proxy) up(client, server net.Conn, armed *atomic.Bool) {
	defer p.wg.Done()
	defer func() { _ = server.Close() }()
	var tail []byte
	buf := make([]byte, 32<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			p.mu.Lock()
			if m := p.marker; m != nil {
				window := append(tail, buf[:n]...)
				if bytes.Contains(window, m) {
					armed.Store(true)
					if p.once {
						p.marker = nil
					}
				}
				tail = append([]byte(nil), window[max(0, len(window)-len(m)):]...)
			}
			p.mu.Unlock()
			if _, werr := server.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// down forwards the server's messages to the client, one protocol message
// at a time. On an armed connection, from the first BindComplete (the
// extended protocol's execution; a prepare's replies before it still pass)
// or CommandComplete (the simple protocol's) on, nothing is passed on: the proxy reads up to ReadyForQuery (the
// statement's implicit transaction has then committed) and closes both
// sides.
func (p *Proxy) down(server, client net.Conn, armed *atomic.Bool) {
	defer p.wg.Done()
	defer func() { _ = client.Close() }()
	var head [5]byte
	dropping := false
	for {
		if _, err := io.ReadFull(server, head[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(head[1:])) - 4
		if n < 0 {
			return
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(server, body); err != nil {
			return
		}
		if armed.Load() && (head[0] == '2' || head[0] == 'C') {
			dropping = true
		}
		if dropping {
			if head[0] == 'Z' {
				p.cut.Add(1)
				_ = server.Close()
				return
			}
			continue
		}
		if _, err := client.Write(append(head[:], body...)); err != nil {
			return
		}
	}
}
