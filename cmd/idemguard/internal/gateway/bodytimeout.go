package gateway

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// A client that sends its header and then its body slowly, or not at
// all, would hold a connection and a goroutine for as long as it liked:
// the Server bounds the header (ReadHeaderTimeout), and a bound on the
// whole request (ReadTimeout) would cut off a large upload on a slow but
// steady link. So, as nginx's client_body_timeout does, each read of a
// request body must bring data within ClientBodyTimeout; past it the read
// fails, the request is answered (a guarded route's 400 body-unreadable,
// before anything is claimed: httpx reads the body before the claim) and
// the connection is closed. A client sending a byte per timeout is served,
// its body bounded by max_body.

// bodyTimeout applies cfg.ClientBodyTimeout to the body of every request
// next serves.
func (gw *Gateway) bodyTimeout(next http.Handler) http.Handler {
	d := gw.cfg.ClientBodyTimeout
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d > 0 && r.Body != nil && r.Body != http.NoBody {
			r.Body = &idleBody{ReadCloser: r.Body, rc: http.NewResponseController(w), timeout: d}
		}
		next.ServeHTTP(w, r)
	})
}

// idleBody is a request body each Read of which must bring data within
// timeout.
type idleBody struct {
	io.ReadCloser
	rc      *http.ResponseController
	timeout time.Duration
	done    bool // the body ended (or failed), or deadlines are not supported
}

func (b *idleBody) Read(p []byte) (int, error) {
	if b.done {
		return b.ReadCloser.Read(p)
	}
	if err := b.rc.SetReadDeadline(time.Now().Add(b.timeout)); err != nil {
		b.done = true // a ResponseWriter without deadlines: read as it is
		return b.ReadCloser.Read(p)
	}
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == io.EOF:
		// The whole body is in: the connection's reads are the Server's
		// again (its background read, which hears a client that goes
		// away, must not time out while the request runs).
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	case err != nil:
		// The deadline stays: what the Server then reads of the body, to
		// keep the connection, fails at once, and the connection is
		// closed.
		b.done = true
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// Said so, without the socket's addresses (httpx's 400
			// puts the error in its detail).
			err = fmt.Errorf("%w (client_body_timeout %v)", errBodyStalled, b.timeout)
		}
	}
	return n, err
}

// errBodyStalled is a body read that brought nothing within
// ClientBodyTimeout.
var errBodyStalled = errors.New("gateway: the client sent no byte of the request body within client_body_timeout")
