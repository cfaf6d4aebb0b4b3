package gateway

import (
	"net/http"
	"net/http/httputil"
)

// transparent is a reverse proxy that passes an answer without a
// Content-Type on without one. httputil.ReverseProxy alone does not:
// net/http sniffs a type for a body it sends with its length (text/html
// for a page, say, which a browser then renders whatever the upstream
// meant), and the guarded routes, which send every kept answer with its
// length, would store and replay that guess. The upstream's silence is
// passed on instead (a field set to nil: net/http then sends none, and
// httpx stores and replays none).
// A request that asks to switch protocols is served by serveSession.
type transparent struct {
	*httputil.ReverseProxy
	gw *Gateway
}

func (p transparent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if asksUpgrade(r.Header) {
		p.serveSession(w, r)
		return
	}
	p.ReverseProxy.ServeHTTP(noTypeGuess{w}, r)
}

// noTypeGuess keeps net/http from sniffing a Content-Type for a final
// answer whose header has none.
type noTypeGuess struct{ http.ResponseWriter }

func (w noTypeGuess) WriteHeader(code int) {
	if code >= 200 {
		if h := w.Header(); h != nil {
			if _, ok := h["Content-Type"]; !ok {
				h["Content-Type"] = nil
			}
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w noTypeGuess) Unwrap() http.ResponseWriter { return w.ResponseWriter }
