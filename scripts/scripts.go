// Package scripts holds the Lua scripts that change an idemguard record in
// Redis. Each runs in one round trip and writes only after comparing the
// owner token, so a script that runs twice gives the same answer. The
// cases of each are in docs/design.md ("The state changes").
//
// Every script but Get starts with record.lua, the record's format (one
// Redis string per key, described there), which reads the record at
// KEYS[1]. A value a script cannot read whole gets an error reply starting
// with CorruptPrefix, and nothing is written.
package scripts

import (
	_ "embed"
	"strings"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed record.lua
	recordSrc string
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
	//go:embed step.lua
	stepSrc string
)

// CorruptPrefix starts the error reply of a script that found a value it
// cannot read.
const CorruptPrefix = "IDEMGUARD_CORRUPT"

// The scripts. Each takes KEYS[1] = the record of one logical key.
var (
	// Claim creates or recovers a pending record, or reports why it cannot.
	Claim = newScript(claimSrc)
	// Complete moves the owner's pending record to completed.
	Complete = newScript(completeSrc)
	// Fail moves the owner's pending record to failed.
	Fail = newScript(failSrc)
	// Release undoes the owner's claim.
	Release = newScript(releaseSrc)
	// Extend pushes the owner's lease out.
	Extend = newScript(extendSrc)
	// Get reads a record and its time to live together; the client
	// decodes the record.
	Get = redis.NewScript(getSrc)
	// Step records a recovery point (a step's result) for the owner of a
	// pending record.
	Step = newScript(stepSrc)
)

var sources = map[*redis.Script]string{Get: getSrc}

// newScript puts record.lua in body: where body marks its place with a
// line "--[[record.lua]]", else in front. Code above the mark runs before
// record.lua makes its functions (each closure costs Redis time on every
// call), for a fast path that needs none of them.
func newScript(body string) *redis.Script {
	src := recordSrc + "\n" + body
	if before, after, ok := strings.Cut(body, recordMark); ok {
		src = before + recordSrc + after
	}
	sc := redis.NewScript(src)
	sources[sc] = src
	return sc
}

const recordMark = "--[[record.lua]]\n"

// All lists every script, for loading them at start-up.
func All() []*redis.Script {
	return []*redis.Script{Claim, Complete, Fail, Release, Extend, Get, Step}
}

// Source returns the Lua text of one of the scripts above, for sending it
// by EVAL, or "" for any other script.
func Source(sc *redis.Script) string { return sources[sc] }

// WithRecord returns a script made of record.lua and body, which may use
// what record.lua reads from KEYS[1] and its functions: for tests that hold
// the Go and Lua codecs to one another.
func WithRecord(body string) *redis.Script { return redis.NewScript(recordSrc + "\n" + body) }
