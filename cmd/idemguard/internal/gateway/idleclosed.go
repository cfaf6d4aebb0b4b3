package gateway

import (
	"errors"
	"net"
)

// An upstream closes an idle keep-alive connection when its own timeout
// passes (Node's keepAliveTimeout, 5 s; a Python, Go or nginx server's),
// and the gateway's Transport may give that connection to a request at
// the same moment: its reader, which would drop the connection from the
// pool on the upstream's FIN, has not run yet (idle_conn_timeout below the
// upstream's narrows the race; a loaded machine, which delays that
// reader, widens it again). Written there, the request's bytes would meet
// a closed socket: the upstream never reads them, yet the gateway, having
// put bytes on a connection, could only answer outcome-unknown. So before
// the first byte of a guarded request goes to a connection, the gate
// looks whether the upstream has closed it (its FIN or RST is in, without
// reading any data: peerClosed). If so nothing is written: the upstream
// closed the connection before a byte of the request reached it, so it
// never saw the request, and the request is sent on another connection
// (gatedTransport.RoundTrip, at most maxIdleClosedRetries times; then the
// key is released, 503 not-forwarded, as for any request that sent
// nothing). An upstream that closes while the request is on its way is
// not seen by this look: the request may have reached it, and the key's
// answer is outcome-unknown, as before.

// errIdleClosed is the gate's refusal of a write to a connection the
// upstream has closed.
var errIdleClosed = errors.New("gateway: the upstream closed the connection before the request was written; nothing was sent on it")

// maxIdleClosedRetries bounds the connections one request tries after
// finding the one it was given closed: each is dropped from the pool, and
// a burst of them can close at once (an upstream's keep-alive timeout
// ends the connections a burst left idle together).
const maxIdleClosedRetries = 4

// peerClosed reports whether the upstream has closed c: its FIN or a reset
// is in (a zero-length peek, or an error other than "would block"; on
// Linux also a FIN behind data waiting to be read, as a TLS server sends
// its close_notify alert before it: POLLRDHUP). Data waiting to be read is
// not a close by itself (a TLS session ticket, or bytes the Transport's
// reader will judge). It never blocks and reads nothing; a
// connection that cannot be looked at (not a socket) is taken as open.
func peerClosed(c net.Conn) bool { return peekClosed(c) }
