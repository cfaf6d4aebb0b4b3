package gateway

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
)

// Switched sessions (a WebSocket, any 101 Switching Protocols, guarded or
// passed through) are connections net/http's Server.Shutdown no longer
// tracks once the proxy took them over. The gateway counts them itself:
// at shutdown they get shutdown_timeout like the requests in flight, then
// the gateway closes both their connections (at the TCP level: it speaks
// none of the switched protocols, so it sends no close frame of its own),
// logs each session it cut and how many were open, and Serve returns once
// they are closed.

// sessionSet counts the switched sessions running.
type sessionSet struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n falls to 0
}

func (s *sessionSet) begin() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == 0 {
		s.idle = make(chan struct{})
	}
	s.n++
}

func (s *sessionSet) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n--
	if s.n == 0 {
		close(s.idle)
	}
}

// wait returns when no session runs, or when ctx ends, with how many
// still run.
func (s *sessionSet) wait(ctx context.Context) int {
	for {
		s.mu.Lock()
		n, idle := s.n, s.idle
		s.mu.Unlock()
		if n == 0 {
			return 0
		}
		select {
		case <-idle:
		case <-ctx.Done():
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.n
		}
	}
}

// session is the state of a request that asked to switch protocols.
type session struct{ switched bool }

type sessionKey struct{}

func sessionFrom(ctx context.Context) *session {
	s, _ := ctx.Value(sessionKey{}).(*session)
	return s
}

// switching notes that the upstream switched protocols for res's request
// (called by the proxy's ModifyResponse, before the proxy takes the
// connections over).
func (gw *Gateway) switching(res *http.Response) {
	if res.StatusCode != http.StatusSwitchingProtocols {
		return
	}
	if s := sessionFrom(res.Request.Context()); s != nil && !s.switched {
		s.switched = true
		gw.sessions.begin()
	}
}

// trackSessions marks each request that asks to switch protocols, and
// counts a session the upstream switched it to (switching) until the
// gateway's whole handler for it returned (a guarded one has its key to
// end after the session), logging it when shutdown cut it.
func (gw *Gateway) trackSessions(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !asksUpgrade(r.Header) {
			next.ServeHTTP(w, r)
			return
		}
		s := &session{}
		defer func() { // also when the handler panics
			if s.switched {
				if errors.Is(context.Cause(gw.hardStop), errShuttingDown) {
					gw.log.Warn("gateway: a switched session was closed at shutdown", "method", r.Method, "path", r.URL.Path,
						"upgrade", r.Header.Get("Upgrade"))
				}
				gw.sessions.end()
			}
		}()
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), sessionKey{}, s)))
	})
}

// serveSession runs the proxy for a request that asks to switch
// protocols, with a context that ends when the gateway must stop
// (net/http's Shutdown does not end it; a guarded request's context
// already does).
func (p transparent) serveSession(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithCancelCause(r.Context())
	stop := context.AfterFunc(p.gw.hardStop, func() { cancel(context.Cause(p.gw.hardStop)) })
	defer func() {
		stop()
		cancel(nil)
	}()
	p.ReverseProxy.ServeHTTP(noTypeGuess{w}, r.WithContext(ctx))
}

// asksUpgrade reports whether h asks to switch protocols (as
// httputil.ReverseProxy reads it: Connection names upgrade).
func asksUpgrade(h http.Header) bool {
	if h.Get("Upgrade") == "" {
		return false
	}
	for _, v := range h["Connection"] {
		for _, tok := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "upgrade") {
				return true
			}
		}
	}
	return false
}
