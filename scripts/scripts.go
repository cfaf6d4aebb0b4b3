// Package scripts holds the Lua scripts that change an idemguard record in
// Redis. Each runs in one round trip and writes only after comparing the
// owner token, so a script that runs twice gives the same answer. The
// cases of each are in docs/design.md ("The state changes").
//
// Every script but Get and CompleteBatch starts with record.lua, the record's format (one
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
	//go:embed complete_batch.lua
	completeBatchSrc string
)

// CorruptPrefix starts the error reply of a script that found a value it
// cannot read.
const CorruptPrefix = "IDEMGUARD_CORRUPT"

// The scripts. Each takes KEYS[1] = the record of one logical key.
//
// The writes that end a claim or record a step (Complete, Fail, Release,
// Step) run even when Redis is out of memory (maxmemory with noeviction):
// they start with the flag line AllowOOM, so a holder whose effect has
// happened can still record it, and a key is not left pending to be run
// again once its lease runs out. Claims are still refused then, so memory
// grows only by the records of the claims under way (their results and
// the steps they record). Extend needs no flag: its
// PEXPIRE is not refused.
var (
	// Claim creates or recovers a pending record, or reports why it cannot.
	Claim = newScript(claimSrc, "")
	// Complete moves the owner's pending record to completed.
	Complete = newScript(completeSrc, AllowOOM)
	// Fail moves the owner's pending record to failed.
	Fail = newScript(failSrc, AllowOOM)
	// Release undoes the owner's claim.
	Release = newScript(releaseSrc, AllowOOM)
	// Extend pushes the owner's lease out.
	Extend = newScript(extendSrc, "")
	// Get reads a record and its time to live together; the client
	// decodes the record.
	Get = redis.NewScript(getSrc)
	// Step records a recovery point (a step's result) for the owner of a
	// pending record.
	Step = newScript(stepSrc, AllowOOM)
	// CompleteBatch is Complete's first comparison for several keys of one
	// Cluster slot: per key, the pending record its holder's claim wrote
	// becomes the completed record; it answers per key 1, or 0 where the
	// record is not that pending record (Complete then decides). It does
	// not use record.lua.
	CompleteBatch = newBareScript(completeBatchSrc, AllowOOM)
)

// AllowOOM is the first line of the scripts that must run when Redis is
// out of memory: a shebang with the allow-oom flag (Redis 7.0 and later).
// A server that cannot read it (miniredis, Redis before 7.0) refuses to
// compile the script; Plain gives the script without it.
const AllowOOM = "#!lua flags=allow-oom\n"

var (
	sources = map[*redis.Script]string{Get: getSrc}
	plain   = map[*redis.Script]*redis.Script{}
)

// newScript puts record.lua in body: where body marks its place with a
// line "--[[record.lua]]", else in front. Code above the mark runs before
// record.lua makes its functions (each closure costs Redis time on every
// call), for a fast path that needs none of them. A non-empty flags line
// goes first, and the script without it is kept for Plain.
func newScript(body, flags string) *redis.Script {
	src := recordSrc + "\n" + body
	if before, after, ok := strings.Cut(body, recordMark); ok {
		src = before + recordSrc + after
	}
	return newBareScript(src, flags)
}

const recordMark = "--[[record.lua]]\n"

// newBareScript registers src, with its flag line flags (and without
// it, for Plain), for a script that does not use record.lua.
func newBareScript(src, flags string) *redis.Script {
	sc := redis.NewScript(flags + src)
	sources[sc] = flags + src
	if flags != "" {
		p := redis.NewScript(src)
		sources[p] = src
		plain[sc] = p
	}
	return sc
}

// Plain returns sc without its flag line (AllowOOM), for a server that
// cannot compile it; a script without one is returned as it is. The plain
// script behaves the same but on a server out of memory, whose refusal of
// its write it reports as an error.
func Plain(sc *redis.Script) *redis.Script {
	if p, ok := plain[sc]; ok {
		return p
	}
	return sc
}

// All lists every script, for loading them at start-up.
func All() []*redis.Script {
	return []*redis.Script{Claim, Complete, Fail, Release, Extend, Get, Step, CompleteBatch}
}

// AllPlain lists every script as Plain gives it, for a server that cannot
// read flag lines.
func AllPlain() []*redis.Script {
	all := All()
	for i, sc := range all {
		all[i] = Plain(sc)
	}
	return all
}

// Source returns the Lua text of one of the scripts above, for sending it
// by EVAL, or "" for any other script.
func Source(sc *redis.Script) string { return sources[sc] }

// WithRecord returns a script made of record.lua and body, which may use
// what record.lua reads from KEYS[1] and its functions: for tests that hold
// the Go and Lua codecs to one another.
func WithRecord(body string) *redis.Script { return redis.NewScript(recordSrc + "\n" + body) }
