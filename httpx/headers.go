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
// named in the response's Connection header, trailers
// (http.TrailerPrefix) and Idempotent-Replayed. Fields the handler did not
// set (those of middleware outside the Guard) are not stored either: a
// replay carries their values of the moment.
func DefaultReplayHeader(name string) bool { return httpcore.DefaultReplayHeader(name) }
