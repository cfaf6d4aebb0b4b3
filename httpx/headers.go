package httpx

import "github.com/idemguard/idemguard/internal/httpcore"

// DefaultReplayHeader is the default Options.ReplayHeader. It keeps every
// field the handler set except Set-Cookie, Authentication-Info and
// Proxy-Authentication-Info (one client's, at one moment: replaying them
// could hand a session or a proof of login to whoever sends the key
// again).
//
// Whatever ReplayHeader says, these are never stored: the hop-by-hop
// fields (Connection, Keep-Alive, Proxy-Connection, Proxy-Authenticate,
// Proxy-Authorization, TE, Trailer, Transfer-Encoding, Upgrade), fields
// named in the response's Connection header, and Idempotent-Replayed.
// Fields the handler did not set (those of middleware outside the Guard)
// are not stored either: a replay carries their values of the moment,
// except one the handler removed, which is stored as removed (a single
// empty value) and which a replay sends without. A replay has the
// Content-Type the first response had: the one net/http sniffed for it
// is stored, and a response that went out without one (the handler
// flushed before its body, set the field to nil, or removed outer
// middleware's) is replayed without one, not with a sniffed one or outer
// middleware's.
// Trailers the handler set (declared in Trailer and set after the status,
// or named with http.TrailerPrefix) are stored by the same rules, under
// their names, and a replay sends them as trailers.
func DefaultReplayHeader(name string) bool { return httpcore.DefaultReplayHeader(name) }
