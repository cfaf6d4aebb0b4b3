package adapter

import "unicode/utf8"

// CutText returns s when it is at most n bytes long, and otherwise its
// longest prefix of at most n bytes that ends on a UTF-8 boundary: for an
// error quoted where its length is bounded (a stored problem, a dead
// letter), the caller marking it as cut.
func CutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
