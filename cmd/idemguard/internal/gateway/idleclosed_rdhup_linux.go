package gateway

import "golang.org/x/sys/unix"

// peerHungUp reports whether the peer of the socket fd has shut its side
// (its FIN is in), whatever data waits before it (POLLRDHUP).
func peerHungUp(fd uintptr) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
	for {
		n, err := unix.Poll(fds, 0)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n > 0 && fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
	}
}
