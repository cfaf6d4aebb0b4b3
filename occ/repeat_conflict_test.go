package occ_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/occ"
)

// cutProxy is a TCP proxy to PostgreSQL that, armed with a piece of SQL,
// passes on the client's bytes that carry it and at once closes the
// client's connection, leaving the server's open: the server runs the
// statement (and commits it) whenever it can, after the client has seen
// its connection die. pgproxy loses a reply only once the statement has
// committed; here the client's repeat can reach the server first.
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	marker []byte
	conns  []net.Conn
	wg     sync.WaitGroup
}

// newCutProxy starts a proxy to the database dsn names and returns a
// *sql.DB through it, opened with extra (URL parameters) added to dsn.
func newCutProxy(t *testing.T, dsn string, extra url.Values) (*cutProxy, *sql.DB) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: u.Host}
	p.wg.Add(1)
	go p.accept()
	u.Host = ln.Addr().String()
	q := u.Query()
	for k, v := range extra {
		q[k] = v
	}
	u.RawQuery = q.Encode()
	db, err := sql.Open("postgres", u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = db.Close()
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.conns = nil
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p, db
}

// cutOnce arms the proxy for the next client write carrying sql.
func (p *cutProxy) cutOnce(sql string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marker = []byte(sql)
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
		p.mu.Lock()
		p.conns = append(p.conns, client, server)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() { // server to client; the server's side stays open
			defer p.wg.Done()
			_, _ = io.Copy(client, server)
		}()
		go func() { // client to server, cut after the marker
			defer p.wg.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := client.Read(buf)
				if n > 0 {
					p.mu.Lock()
					cut := p.marker != nil && bytes.Contains(buf[:n], p.marker)
					if cut {
						p.marker = nil
					}
					p.mu.Unlock()
					if _, err := server.Write(buf[:n]); err != nil {
						return
					}
					if cut {
						_ = client.Close()
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// TestVersionedUpdateRepeatSerializationFailure: an Update through a pool
// type whose connection died after the statement went out, while
// PostgreSQL still had it waiting for a row lock. database/sql sends it
// again on another connection; it queues behind the first, which then
// applies; under REPEATABLE READ or SERIALIZABLE (a server's or role's
// default_transaction_isolation) the repeat fails with a serialization
// failure (40001) instead of matching no row. Update returned that as a
// conflict, though it had sent the statement twice, and UpdateRetry read
// the row afresh and applied the deposit a second time: 10 made 20.
func TestVersionedUpdateRepeatSerializationFailure(t *testing.T) {
	t.Parallel()
	direct, dsn := testenv.Postgres(t)
	acc := accountsTable(t, direct)
	p, db := newCutProxy(t, dsn, url.Values{
		"binary_parameters":             {"yes"}, // the statement in one write
		"default_transaction_isolation": {"repeatable read"},
	})
	before, _ := readAccount(t, direct)

	lock, err := direct.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback() }()
	var holder int
	if err := lock.QueryRowContext(ctx, `SELECT pg_backend_pid() FROM occ_accounts WHERE id = 1 FOR UPDATE`).Scan(&holder); err != nil {
		t.Fatal(err)
	}

	p.cutOnce(`UPDATE "occ_accounts"`)
	done := make(chan error, 1)
	go func() {
		_, err := acc.UpdateRetry(ctx, appDB{db}, 1, occ.RetryOptions{MaxTries: 3}, func(ctx context.Context) (int64, map[string]any, error) {
			var balance, version int64
			err := direct.QueryRowContext(ctx, `SELECT balance, version FROM occ_accounts WHERE id = 1`).Scan(&balance, &version)
			return version, map[string]any{"balance": balance + 10}, err
		})
		done <- err
	}()
	// Both sends wait: the first for the lock, the repeat behind it.
	testenv.WaitFor(t, 30*time.Second, "the update and its repeat to wait for the row lock", func() bool {
		var n int
		_ = direct.QueryRowContext(ctx, `WITH first AS (SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)))
			SELECT count(*) FROM pg_stat_activity
			WHERE $1 = ANY(pg_blocking_pids(pid)) OR pg_blocking_pids(pid) && ARRAY(SELECT pid FROM first)`, holder).Scan(&n)
		return n >= 2
	})
	if err := lock.Commit(); err != nil {
		t.Fatal(err)
	}
	err = <-done
	after, _ := readAccount(t, direct)
	switch {
	case after-before > 10:
		t.Fatalf("a deposit of 10 sent twice moved the balance by %d (UpdateRetry: %v)", after-before, err)
	case err == nil:
		t.Fatalf("UpdateRetry succeeded; its first send's connection was cut (balance moved by %d)", after-before)
	case occ.IsConflict(err):
		t.Fatalf("UpdateRetry = %v; an update sent twice, whose first send may have applied, is not a conflict", err)
	case !errors.Is(err, occ.ErrUnavailable) || !strings.Contains(err.Error(), "could not serialize"):
		t.Fatalf("UpdateRetry = %v; want ErrUnavailable after a repeat that met a serialization failure (else the test proves nothing)", err)
	}
	t.Logf("balance moved by %d; UpdateRetry: %v", after-before, err)
}
