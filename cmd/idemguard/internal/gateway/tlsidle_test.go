package gateway

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
)

// slowReader is an upstream connection whose reader, once held, does not
// run until something is written to it or it is closed: what comes in
// stays in the socket (heldEOF's loaded gateway, whose reading goroutine
// had not run yet when the upstream closed the idle connection; here the
// bytes are left unread in the kernel, as they are then).
type slowReader struct {
	*net.TCPConn
	hold    atomic.Bool
	release chan struct{}
	once    sync.Once
}

func (c *slowReader) Read(p []byte) (int, error) {
	for {
		if c.hold.Load() {
			<-c.release
		}
		_ = c.TCPConn.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
		n, err := c.TCPConn.Read(p)
		var ne net.Error
		if n == 0 && errors.As(err, &ne) && ne.Timeout() {
			continue
		}
		return n, err
	}
}

func (c *slowReader) Write(p []byte) (int, error) {
	if c.hold.Load() {
		c.once.Do(func() { close(c.release) })
	}
	return c.TCPConn.Write(p)
}

func (c *slowReader) Close() error {
	c.once.Do(func() { close(c.release) })
	return c.TCPConn.Close()
}

// pending reports whether bytes wait unread in c's socket.
func pending(c *net.TCPConn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var n int
	_ = raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, _ = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	})
	return n > 0
}

// TestTLSIdleConnClosedByUpstreamIsNotUsed is
// TestIdleConnClosedByUpstreamIsNotUsed over TLS: an https upstream closes
// an idle keep-alive connection as every TLS server does, with a
// close_notify alert and then its FIN, just as the gateway hands that
// connection to a guarded request. The upstream closed it before a byte
// of the request was written, so it never saw the request: it must go on
// another connection, not be answered outcome-unknown for good.
func TestTLSIdleConnClosedByUpstreamIsNotUsed(t *testing.T) {
	t.Run("plain", func(t *testing.T) { testIdleClosedBehindData(t, false) }) // passes: the FIN alone is seen
	t.Run("tls", func(t *testing.T) { testIdleClosedBehindData(t, true) })
}

func testIdleClosedBehindData(t *testing.T, useTLS bool) {
	var mu sync.Mutex
	orders := map[string]int{}
	var serverConns []net.Conn
	u := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Order string `json:"order"`
		}
		_ = json.NewDecoder(r.Body).Decode(&in)
		mu.Lock()
		orders[in.Order]++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"order":"`+in.Order+`"}`)
	}))
	u.Config.ErrorLog = log.New(io.Discard, "", 0)
	u.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			serverConns = append(serverConns, c)
			mu.Unlock()
		}
	}
	if useTLS {
		u.StartTLS()
	} else {
		u.Start()
	}
	defer u.Close()

	conns := make(chan *slowReader, 8)
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		h := &slowReader{TCPConn: c.(*net.TCPConn), release: make(chan struct{})}
		conns <- h
		return h, nil
	}
	cfg, _ := config(t, basicConfig, u.URL)
	e := startConfigured(t, cfg, func(o *Options) { o.dial = dial })
	if useTLS {
		e.gw.transport.t.TLSClientConfig = &tls.Config{RootCAs: u.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}
	}
	if r := post(t, e.srv.URL+"/orders", "k-tlsidle-1", `{"order":"tlsidle1"}`, "X-Account-Id", "acme"); r.status != http.StatusCreated {
		t.Fatalf("first request: %d %q", r.status, r.body)
	}
	first := <-conns
	first.hold.Store(true)
	time.Sleep(50 * time.Millisecond) // the reader's last poll is over
	// The upstream's keep-alive timeout: the server closes the idle
	// connection (tls.Conn.Close: close_notify, then FIN).
	mu.Lock()
	for _, c := range serverConns {
		_ = c.Close()
	}
	mu.Unlock()
	if useTLS {
		testenv.WaitFor(t, 10*time.Second, "the upstream's close_notify and FIN", func() bool { return pending(first.TCPConn) })
		time.Sleep(50 * time.Millisecond)
	} else {
		testenv.WaitFor(t, 10*time.Second, "the upstream's FIN", func() bool { return peerClosed(first.TCPConn) })
	}

	r := post(t, e.srv.URL+"/orders", "k-tlsidle-2", `{"order":"tlsidle2"}`, "X-Account-Id", "acme")
	mu.Lock()
	n1, n2 := orders["tlsidle1"], orders["tlsidle2"]
	mu.Unlock()
	if r.status != http.StatusCreated || n1 != 1 || n2 != 1 {
		t.Fatalf("a request given a TLS connection the upstream had closed: %d %q, the upstream ran it %d times; want the upstream's 201, once", r.status, r.body, n2)
	}
}
