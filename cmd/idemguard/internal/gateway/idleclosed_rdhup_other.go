//go:build darwin || freebsd || netbsd || openbsd || dragonfly

package gateway

// peerHungUp: these systems have no POLLRDHUP; a FIN behind waiting data
// is not seen.
func peerHungUp(uintptr) bool { return false }
