-- Single-version optimistic concurrency: every update names the version it
-- read and bumps it (occ.VersionedTable.Update).
ALTER TABLE {{.Table}} ADD COLUMN {{.Column}} bigint NOT NULL DEFAULT 1;
