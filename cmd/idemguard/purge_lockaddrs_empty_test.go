package main

import "testing"

// --lock-addrs given empty (a script's unset $LOCK_NODES) asks for the
// lock with no node in it, as ",," does, which purge refuses: running
// without the lock is not what was asked. (It was read as not given, and
// the purge ran unlocked.)
func TestPurgeEmptyLockAddrsRefused(t *testing.T) {
	dead := "postgres://nobody@" + deadAddr(t) + "/db?sslmode=disable"
	code, _, stderr := cli(t, "purge", "--postgres", dead, "--before", "0s", "--lock-addrs", "")
	wantError(t, code, stderr, 2, "--lock-addrs")
}
