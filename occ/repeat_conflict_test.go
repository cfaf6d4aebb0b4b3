package occ_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/occ"
)

// cutProxy is a TCP proxy to PostgreSQL that, armed with a piece of SQL,
// passes on the statement that holds it and at once closes the client's
// connection, leaving the server's open: the server runs the
// statement (and commits it) whenever it can, after the client has seen
// its connection die. pgproxy loses a reply only once the statement has
// committed; here the client's repeat can reach the server first.
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	marker []byte
	conns  []net.Conn
	// beforeCut, if set, runs before the client's connection is closed:
	// it waits for the server to be at a point the test wants.
	beforeCut func()
	wg        sync.WaitGroup
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

// cutOnce arms the proxy for the next statement whose SQL holds sql.
func (p *cutProxy) cutOnce(sql string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marker = []byte(sql)
}

// blocked reports whether at least n backends wait, directly or behind
// another waiter, for the locks of the backend holder.
func blocked(db *sql.DB, holder, n int) bool {
	var got int
	_ = db.QueryRowContext(ctx, `WITH first AS (SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)))
		SELECT count(*) FROM pg_stat_activity
		WHERE $1 = ANY(pg_blocking_pids(pid)) OR pg_blocking_pids(pid) && ARRAY(SELECT pid FROM first)`, holder).Scan(&got)
	return got >= n
}

// holdCut makes the proxy wait, once it has passed the statement on and
// before it cuts the client's connection, until the test lets it: the
// test's goroutine waits on the returned channel for the statement to be
// passed on, checks what it wants, and closes release.
func (p *cutProxy) holdCut(t *testing.T) (passed <-chan struct{}, release func()) {
	c, r := make(chan struct{}), make(chan struct{})
	p.beforeCut = func() {
		close(c)
		<-r
	}
	release = sync.OnceFunc(func() { close(r) })
	t.Cleanup(release) // before the proxy's own, which waits for it
	return c, release
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
			armed, bound := false, false // this connection prepared, bound the marker's statement
			for {
				n, err := client.Read(buf)
				if n > 0 {
					// lib/pq prepares the statement (Parse, its text),
					// waits for the reply, then runs it (Bind, Execute,
					// Sync): cut once the Sync that follows the marker's
					// Bind has gone to the server.
					bound = bound || armed && buf[0] == 'B'
					cut := bound && bytes.HasSuffix(buf[:n], []byte{'S', 0, 0, 0, 4})
					p.mu.Lock()
					if p.marker != nil && bytes.Contains(buf[:n], p.marker) {
						armed, p.marker = true, nil
					}
					p.mu.Unlock()
					if _, err := server.Write(buf[:n]); err != nil {
						return
					}
					if cut {
						if p.beforeCut != nil {
							p.beforeCut()
						}
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

	passed, release := p.holdCut(t)
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
	// The first send queues for the row lock before its client sees the
	// connection cut, and the repeat queues behind it.
	<-passed
	testenv.WaitFor(t, 30*time.Second, "the update to wait for the row lock", func() bool { return blocked(direct, holder, 1) })
	release()
	testenv.WaitFor(t, 30*time.Second, "its repeat to wait behind it", func() bool { return blocked(direct, holder, 2) })
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

// TestVectorWriteRepeatSerializationFailure: the lost send of
// TestVersionedUpdateRepeatSerializationFailure, for VectorTable.Write. The
// repeat, queued behind the first send, fails with a serialization failure;
// Write returned it as a conflict (carrying no versions: "run the
// transaction again"), and the application, re-reading and writing its
// change on what it read (its own first write already there), made a
// deposit of 10 twice.
func TestVectorWriteRepeatSerializationFailure(t *testing.T) {
	t.Parallel()
	direct, dsn := testenv.Postgres(t)
	tbl := cartsTable(t, direct, "w")
	if _, err := tbl.Write(ctx, direct, "c", occ.Vector{}, []byte(`100`)); err != nil {
		t.Fatal(err)
	}
	balance := func() int64 {
		t.Helper()
		v, err := tbl.Read(ctx, direct, "c")
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseInt(string(v.Value), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	p, db := newCutProxy(t, dsn, url.Values{
		"default_transaction_isolation": {"repeatable read"},
	})
	lock, err := direct.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback() }()
	var holder int
	if err := lock.QueryRowContext(ctx, `SELECT pg_backend_pid() FROM occ_carts WHERE id = 'c' FOR UPDATE`).Scan(&holder); err != nil {
		t.Fatal(err)
	}

	passed, release := p.holdCut(t)
	p.cutOnce(`UPDATE "occ_carts"`)
	done := make(chan error, 1)
	go func() {
		done <- occ.RetryOnConflict(ctx, occ.RetryOptions{MaxTries: 3}, func(ctx context.Context) error {
			v, err := tbl.Read(ctx, direct, "c")
			if err != nil {
				return err
			}
			n, err := strconv.ParseInt(string(v.Value), 10, 64)
			if err != nil {
				return err
			}
			_, err = tbl.Write(ctx, appDB{db}, "c", v.Vector, []byte(strconv.FormatInt(n+10, 10)))
			return err
		})
	}()
	// The first send queues for the row lock before its client sees the
	// connection cut, and the repeat queues behind it.
	<-passed
	testenv.WaitFor(t, 30*time.Second, "the write to wait for the row lock", func() bool { return blocked(direct, holder, 1) })
	release()
	testenv.WaitFor(t, 30*time.Second, "its repeat to wait behind it", func() bool { return blocked(direct, holder, 2) })
	if err := lock.Commit(); err != nil {
		t.Fatal(err)
	}
	err = <-done
	switch moved := balance() - 100; {
	case moved > 10:
		t.Fatalf("a deposit of 10 sent twice moved the balance by %d (RetryOnConflict: %v)", moved, err)
	case err == nil:
		t.Fatalf("the write succeeded; its first send's connection was cut (balance moved by %d)", moved)
	case occ.IsConflict(err):
		t.Fatalf("Write = %v; a write sent twice, whose first send may have applied, is not a conflict", err)
	case !errors.Is(err, occ.ErrUnavailable) || !strings.Contains(err.Error(), "could not serialize"):
		t.Fatalf("Write = %v; want ErrUnavailable after a repeat that met a serialization failure (else the test proves nothing)", err)
	}
}
