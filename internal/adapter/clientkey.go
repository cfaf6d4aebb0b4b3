package adapter

import (
	"net/http"
	"strings"
)

// HasKey reports whether the values of a request's key field (a header,
// gRPC metadata) hold a key: an empty or blank value is none, as the
// servers' guards read it, not a key for a retrying client to send again.
func HasKey(values []string) bool {
	for _, v := range values {
		if strings.Trim(v, " \t") != "" {
			return true
		}
	}
	return false
}

// OtherSpelling reports the name of the one entry of h that holds field
// name (canonical) under another spelling (a map entry not in canonical
// form, h["idempotency-key"]), when h has no entry of name itself: the
// caller's own key, for a retrying client to send as the one field of
// name, not beside a fresh key of its own. Two such entries are two
// fields, the server's to refuse: none is reported.
func OtherSpelling(h http.Header, name string) (string, bool) {
	if _, ok := h[name]; ok {
		return "", false
	}
	found := ""
	for k := range h {
		if k != name && strings.EqualFold(k, name) {
			if found != "" {
				return "", false
			}
			found = k
		}
	}
	return found, found != ""
}
