package gateway

import (
	"context"
	"database/sql"
	"time"

	"github.com/idemguard/idemguard/internal/pgsql"
	"github.com/idemguard/idemguard/internal/sqlstate"
)

// consultSecondary runs at start under fallback policy secondary. The
// fallback's switch-back check (a claim Redis grants is checked against
// PostgreSQL) lives in the process that wrote to PostgreSQL during an
// outage; a gateway started after one (a restart, a deploy, another
// replica) would claim in Redis a key PostgreSQL holds, and run it again.
// So the gateway reads when the last live record of its own in the
// secondary's keys table expires (rows under its SecondaryScopeTag; other
// services' gateways sharing the table are not its business), by the
// database's clock, and checks against it until then (none: no check, no
// cost). Rows of an older version (under a bare scope, secondaryscope.go)
// may be any gateway's: while they live they are checked against too,
// and honoured read only. A secondary it cannot read is taken to hold
// records for the longest route's lease and TTL: an unknown answer never
// runs an effect, and fresh keys then wait for PostgreSQL to answer.
func (gw *Gateway) consultSecondary(ctx context.Context) {
	if gw.fb == nil || gw.db == nil || gw.secondary == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, secondaryConnectTimeout+time.Second)
	defer cancel()
	keys := pgsql.NewTables(gw.cfg.Fallback.Schema, pgsql.DefaultTablePrefix).Keys
	var ownUS, legacyUS sql.NullInt64
	err := gw.db.QueryRowContext(ctx, `SELECT `+
		pgsql.UntilUS(`max(expires_at) FILTER (WHERE starts_with(scope, $1))`)+`, `+
		pgsql.UntilUS(`max(expires_at) FILTER (WHERE scope !~ $2)`)+
		` FROM `+keys+` WHERE expires_at > `+pgsql.ClockNow,
		SecondaryScopeTag(gw.cfg.Redis.Prefix), secondaryScopeForm).Scan(&ownUS, &legacyUS)
	switch {
	case sqlstate.UndefinedTable(err):
		gw.log.Warn("gateway: the fallback PostgreSQL has no idemguard tables: create them (idemguard migrate up) before an outage needs them", "err", err)
		return
	case err != nil:
		var longest time.Duration
		for _, rt := range gw.routes {
			longest = max(longest, rt.cfg.TTL+rt.cfg.Lease)
		}
		gw.log.Warn("gateway: cannot read the fallback PostgreSQL at start; claims are checked against it, and fresh keys refused while it cannot answer, for the longest route's lease and TTL", "for", longest.String(), "err", err)
		gw.secondary.honourLegacy(time.Now().Add(longest))
		gw.fb.ConsultSecondary(time.Now().Add(longest))
		return
	}
	if legacyUS.Valid {
		left := time.Duration(legacyUS.Int64) * time.Microsecond
		gw.log.Warn("gateway: the fallback PostgreSQL holds keys an older idemguard kept by caller, method and route alone (any service's): they are honoured, read only, until the last expires", "for", left.String())
		gw.secondary.honourLegacy(time.Now().Add(left))
		ownUS.Int64, ownUS.Valid = max(ownUS.Int64, legacyUS.Int64), true
	}
	if !ownUS.Valid {
		return // no live record: nothing to switch back from
	}
	left := time.Duration(ownUS.Int64) * time.Microsecond
	gw.log.Info("gateway: the fallback PostgreSQL holds keys from an outage; claims are checked against it until the last expires", "for", left.String())
	gw.fb.ConsultSecondary(time.Now().Add(left))
}

// secondaryScopeForm matches the scopes SecondaryScope gives, for any
// prefix (a quoted string then a colon), in PostgreSQL's regular
// expressions: a row not matching it was written by an older version.
const secondaryScopeForm = `^"([^"\\]|\\.)*":`
