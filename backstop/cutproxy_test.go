package backstop_test

import (
	"bytes"
	"database/sql"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/pgstore"
)

// cutProxy is a TCP proxy between the database/sql driver and PostgreSQL
// that can lose the replies of a statement: armed with a piece of SQL, it
// forwards every statement whose text contains it, lets the server run it
// and commit (it reads the server's replies up to ReadyForQuery), then
// closes both connections without passing a byte of that reply on. The
// client sees its connection die after the statement committed: the reply
// lost on the way back. (database/sql sends a statement made outside a
// transaction again on another connection when lib/pq reports the first
// one bad, up to three times in all; the proxy loses those replies too,
// until keepReplies.)
type cutProxy struct {
	t      testing.TB
	ln     net.Listener
	target string

	mu     sync.Mutex
	marker []byte // armed: the SQL whose replies are lost; nil: forward all
	cut    atomic.Int64
	wg     sync.WaitGroup
	conns  map[net.Conn]struct{}
	closed bool
}

// newCutProxy starts a proxy to PostgreSQL and returns a *sql.DB whose
// connections go through it, into the schema of a migrated database
// (pgenv.Migrated's, whose URL is dsn).
func newCutProxy(t testing.TB, dsn string) (*cutProxy, *sql.DB) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{t: t, ln: ln, target: u.Host, conns: map[net.Conn]struct{}{}}
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

// loseReplies arms the proxy: from now on, every statement whose SQL
// contains sql runs and commits, and its client's connection dies before
// the reply.
func (p *cutProxy) loseReplies(sql string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marker = []byte(sql)
}

// keepReplies disarms the proxy: replies reach the client again.
func (p *cutProxy) keepReplies() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marker = nil
}

// cuts returns how many replies the proxy has lost.
func (p *cutProxy) cuts() int64 { return p.cut.Load() }

func (p *cutProxy) close() {
	p.mu.Lock()
	p.closed = true
	_ = p.ln.Close()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *cutProxy) track(cs ...net.Conn) bool {
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

func (p *cutProxy) accept() {
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
func (p *cutProxy) up(client, server net.Conn, armed *atomic.Bool) {
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
// at a time. On an armed connection, from the first CommandComplete on,
// nothing is passed on: the proxy reads up to ReadyForQuery (the
// statement's implicit transaction has then committed) and closes both
// sides.
func (p *cutProxy) down(server, client net.Conn, armed *atomic.Bool) {
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
		if armed.Load() && head[0] == 'C' {
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

// TestCutProxyLosesReply: the proxy itself. A statement whose replies are
// lost fails at the client though it committed at the server (once per
// time database/sql sent it), and statements go through again once the
// proxy is disarmed.
func TestCutProxyLosesReply(t *testing.T) {
	t.Parallel()
	_, dsn := testenv.Postgres(t)
	direct, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	p, db := newCutProxy(t, dsn)
	if _, err := db.ExecContext(ctx, `CREATE TABLE cut (n int)`); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		t.Helper()
		var n int
		if err := direct.QueryRowContext(ctx, `SELECT count(*) FROM cut`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	p.loseReplies("INSERT INTO cut")
	if _, err := db.ExecContext(ctx, `INSERT INTO cut VALUES ($1)`, 1); err == nil {
		t.Fatalf("insert whose replies were lost succeeded (cuts %d)", p.cuts())
	}
	p.keepReplies()
	if n := count(); p.cuts() < 1 || int64(n) != p.cuts() {
		t.Fatalf("rows committed = %d, replies lost = %d; want as many, at least one", n, p.cuts())
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO cut VALUES ($1)`, 2); err != nil {
		t.Fatalf("through the proxy disarmed: %v", err)
	}
}

// TestWrapMarkReplyLost: a claim whose mark committed in PostgreSQL but
// whose reply never came back fails (the backstop's answer is unknown) and
// releases its claim in Redis. The key must then be as if never claimed,
// as after any released first attempt: a request with another payload
// takes it, rather than being refused as a mismatch by the orphaned mark
// for the mark's whole retention. The batch path undoes its claims the
// same way.
func TestWrapMarkReplyLost(t *testing.T) {
	t.Parallel()
	direct, dsn := testenv.Postgres(t)
	if err := pgstore.Migrate(ctx, direct, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	p, db := newCutProxy(t, dsn)
	b := mustBackstop(t, db, pgstore.Options{})
	s := backstop.Wrap(guardenv.Store(t, guard.RedisOptions{}), b)
	bs, ok := s.(guard.BatchStore)
	if !ok {
		t.Fatalf("%T is not a guard.BatchStore", s)
	}
	for _, batch := range []bool{false, true} {
		t.Run(map[bool]string{false: "claim", true: "batch"}[batch], func(t *testing.T) {
			key := newKey(t)
			claim := func(tok, fp string) (guard.Outcome, error) {
				req := guard.ClaimRequest{Key: key, Token: tok, Fingerprint: fp, Lease: 10 * time.Second, TTL: time.Hour, MaxAttempts: 3}
				if !batch {
					return s.Claim(ctx, req)
				}
				out, errs := bs.ClaimBatch(ctx, []guard.ClaimRequest{req})
				return out[0], errs[0]
			}
			before := p.cuts()
			p.loseReplies("RETURNING fence")
			out, err := claim("A", "fp-a")
			p.keepReplies()
			if !errors.Is(err, guard.ErrUnavailable) {
				t.Fatalf("claim whose mark's reply was lost = %s, %v; want ErrUnavailable", out.Status, err)
			}
			var n int
			if err := direct.QueryRowContext(ctx, `SELECT count(*) FROM idemguard_keys WHERE id = $1 AND token = 'A'`, key.ID).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if p.cuts() == before || n != 1 {
				t.Fatalf("replies lost %d, marks of A %d: the mark did not commit, the test proves nothing", p.cuts()-before, n)
			}
			out, err = claim("B", "fp-b")
			if err != nil || out.Status != guard.Acquired || out.Lease.Attempt != 1 {
				t.Fatalf("claim with another payload after the failed claim = %s (attempt %d), %v; want a first attempt acquired", out.Status, out.Lease.Attempt, err)
			}
		})
	}
}
