// Package pgproxy is a test helper: a TCP proxy between database/sql and
// PostgreSQL that loses the replies of chosen statements, once they
// committed (LoseReply) or as soon as they went to the server, which runs
// them whenever it can (CutAfterSend), to test what a caller makes of an
// outcome it cannot know. Only tests import it.
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
// until KeepReplies.) Armed by CutAfterSend instead, it cuts the client's
// connection as soon as the statement has gone to the server, leaving the
// server's open: the server runs and commits the statement whenever it
// can, after the client's repeat perhaps.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	marker []byte // armed: the SQL whose replies are lost; nil: forward all
	once   bool   // disarm after the first statement armed
	early  bool   // armed by CutAfterSend: cut when sent, not after commit
	// beforeCut, if set, runs on a CutAfterSend statement's connection
	// after the statement went to the server, before the client's
	// connection is closed (HoldCut).
	beforeCut func()
	cut       atomic.Int64
	wg        sync.WaitGroup
	conns     map[net.Conn]struct{}
	closed    bool
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
	p.marker, p.once, p.early = []byte(sql), false, false
}

// LoseReply arms the proxy for one statement: the next statement whose SQL
// contains sql runs and commits, and its client's connection dies before
// the reply; later ones (database/sql's own retry among them) go through.
func (p *Proxy) LoseReply(sql string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marker, p.once, p.early = []byte(sql), true, false
}

// CutAfterSend arms the proxy for one statement: the next statement whose
// SQL contains sql goes to the server whole (lib/pq's Parse, then its
// Bind, Execute and Sync), and then the client's connection is closed at
// once while the server's stays open until the proxy closes. The server
// runs and commits the statement whenever it can (after a row lock it
// waits for is released, say), which may be after database/sql has sent
// the statement again on another connection. Its reply is lost. Later
// statements go through.
func (p *Proxy) CutAfterSend(sql string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marker, p.once, p.early = []byte(sql), true, true
}

// HoldCut makes a CutAfterSend cut wait until the test lets it: once the
// statement has gone to the server, and before the client's connection is
// closed, the proxy closes sent and waits for release. The test waits on
// sent, checks what it wants (that the server holds the statement, say),
// and calls release; release runs at the latest when the test ends,
// before the proxy closes.
func (p *Proxy) HoldCut(t testing.TB) (sent <-chan struct{}, release func()) {
	c, r := make(chan struct{}), make(chan struct{})
	release = sync.OnceFunc(func() { close(r) })
	t.Cleanup(release) // before New's, which waits for the hold to end
	p.mu.Lock()
	defer p.mu.Unlock()
	p.beforeCut = func() {
		close(c)
		<-r
	}
	return c, release
}

// KeepReplies disarms the proxy: replies reach the client again.
// A CutAfterSend not yet met is disarmed too.
func (p *Proxy) KeepReplies() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marker = nil
}

// Cuts returns how many replies the proxy has lost (a connection cut by
// CutAfterSend counts as one).
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
// when they carry the marker's SQL. A connection armed by CutAfterSend is
// cut here: once the Sync that follows the statement's Bind has gone to
// the server, the client's side is closed and the server's left open.
func (p *Proxy) up(client, server net.Conn, armed *atomic.Bool) {
	defer p.wg.Done()
	keepServer := false
	defer func() {
		if !keepServer {
			_ = server.Close()
		}
	}()
	var tail []byte
	early, bound := false, false // this connection prepared, bound a CutAfterSend statement
	buf := make([]byte, 32<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			// lib/pq prepares the statement (Parse, its text), waits
			// for the reply, then runs it (Bind, Execute, Sync).
			bound = bound || early && buf[0] == 'B'
			cut := bound && bytes.HasSuffix(buf[:n], []byte{'S', 0, 0, 0, 4})
			p.mu.Lock()
			if m := p.marker; m != nil {
				window := append(tail, buf[:n]...)
				if bytes.Contains(window, m) {
					if p.early {
						early = true
					} else {
						armed.Store(true)
					}
					if p.once {
						p.marker = nil
					}
				}
				tail = append([]byte(nil), window[max(0, len(window)-len(m)):]...)
			}
			hold := p.beforeCut
			p.mu.Unlock()
			if _, werr := server.Write(buf[:n]); werr != nil {
				return
			}
			if cut {
				if hold != nil {
					hold()
				}
				p.cut.Add(1)
				keepServer = true
				_ = client.Close()
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
