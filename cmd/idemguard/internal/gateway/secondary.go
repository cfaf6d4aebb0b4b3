package gateway

import (
	"context"
	"database/sql"
	"time"

	"github.com/idemguard/idemguard/internal/pgsql"
	"github.com/idemguard/idemguard/internal/sqlstate"
)

// consultSecondary runs at start under fallback policy secondary. The
// fallback checks every claim Redis grants against PostgreSQL, but one
// PostgreSQL cannot answer stands unless a record the process wrote there
// may still live (fallback.Store.ConsultUntil); a gateway started after an
// outage (a restart, a deploy, another replica) wrote none, so it would
// let Redis run a key PostgreSQL holds whenever PostgreSQL failed to
// answer the check. So the gateway reads when the last live record of its
// own in the secondary's keys table expires (rows under its
// SecondaryScopeTag; other services' gateways sharing the table are not
// its business), by the database's clock, and refuses such claims until
// then (none: a check PostgreSQL cannot answer lets the claim stand). Rows
// of an older version (under a bare scope, secondaryscope.go) may be any
// gateway's: while they live they are honoured too, read only. A
// secondary it cannot read at start is taken to hold records for the
// longest route's lease and TTL: an unknown answer never runs an effect,
// and fresh keys then wait for PostgreSQL to answer.
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
		left := pgsql.Micros(legacyUS.Int64) // saturated: a row kept for centuries would wrap
		gw.log.Warn("gateway: the fallback PostgreSQL holds keys an older idemguard kept by caller, method and route alone (any service's): they are honoured, read only, until the last expires", "for", left.String())
		gw.secondary.honourLegacy(time.Now().Add(left))
		ownUS.Int64, ownUS.Valid = max(ownUS.Int64, legacyUS.Int64), true
	}
	if !ownUS.Valid {
		return // no live record: nothing to switch back from
	}
	left := pgsql.Micros(ownUS.Int64)
	gw.log.Info("gateway: the fallback PostgreSQL holds keys from an outage; claims are checked against it until the last expires", "for", left.String())
	gw.fb.ConsultSecondary(time.Now().Add(left))
}

// secondaryScopeForm matches the scopes SecondaryScope gives, for any
// prefix (a quoted string then a colon), in PostgreSQL's regular
// expressions: a row not matching it was written by an older version.
const secondaryScopeForm = `^"([^"\\]|\\.)*":`
