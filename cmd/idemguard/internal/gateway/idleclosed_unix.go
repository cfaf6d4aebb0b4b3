//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package gateway

import (
	"errors"
	"net"
	"syscall"
)

// peekClosed peeks at c's socket without blocking or consuming (peerClosed).
// It uses RawConn.Control, which, unlike RawConn.Read, does not wait for
// the Transport's reader, blocked in a Read of the same connection.
func peekClosed(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	err = raw.Control(func(fd uintptr) {
		var b [1]byte
		for {
			n, _, rerr := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			switch {
			case errors.Is(rerr, syscall.EINTR):
				continue
			case rerr == nil:
				// Bytes waiting may hide the FIN behind them: a TLS
				// server closes with a close_notify alert, then its FIN.
				closed = n == 0 || peerHungUp(fd)
			default:
				closed = !errors.Is(rerr, syscall.EAGAIN) && !errors.Is(rerr, syscall.EWOULDBLOCK)
			}
			return
		}
	})
	return err == nil && closed
}
