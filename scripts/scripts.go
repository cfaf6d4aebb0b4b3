// Package scripts holds the Lua scripts that change an idemguard record in
// Redis. Each runs in one round trip and writes only after comparing the
// owner token, so a script that runs twice gives the same answer.
package scripts

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed claim.lua
	claimSrc string
	//go:embed complete.lua
	completeSrc string
	//go:embed fail.lua
	failSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed extend.lua
	extendSrc string
	//go:embed get.lua
	getSrc string
)

// The scripts. Each takes KEYS[1] = the record hash and KEYS[2] = the lease
// string of one logical key; both names must carry the same hash tag.
var (
	// Claim creates or recovers a pending record, or reports why it cannot.
	Claim = redis.NewScript(claimSrc)
	// Complete moves the owner's pending record to completed.
	Complete = redis.NewScript(completeSrc)
	// Fail moves the owner's pending record to failed.
	Fail = redis.NewScript(failSrc)
	// Release undoes the owner's claim.
	Release = redis.NewScript(releaseSrc)
	// Extend pushes the owner's lease out.
	Extend = redis.NewScript(extendSrc)
	// Get reads a record, its lease and its retention.
	Get = redis.NewScript(getSrc)
)

// All lists every script, for loading them at start-up.
func All() []*redis.Script {
	return []*redis.Script{Claim, Complete, Fail, Release, Extend, Get}
}

// Source returns the Lua text of one of the scripts above, for sending it
// by EVAL, or "" for any other script.
func Source(sc *redis.Script) string {
	switch sc {
	case Claim:
		return claimSrc
	case Complete:
		return completeSrc
	case Fail:
		return failSrc
	case Release:
		return releaseSrc
	case Extend:
		return extendSrc
	case Get:
		return getSrc
	}
	return ""
}
