-- Idempotency keys: one row per (scope, id). Written by the Postgres Store
-- (a full guard record with its lease) and by the backstop (the row
-- committed in the business transaction, and the fence marks of Guarded).
CREATE TABLE {{.Keys}} (
    scope        text        NOT NULL,
    id           text        NOT NULL,
    fingerprint  text        NOT NULL,
    status       text        NOT NULL CHECK (status IN ('pending', 'completed', 'failed')),
    token        text        NOT NULL,
    fence        bigint      NOT NULL CHECK (fence > 0),
    attempt      integer     NOT NULL DEFAULT 1 CHECK (attempt >= 0),
    recovered    boolean     NOT NULL DEFAULT false,
    result       bytea,
    last_error   text        NOT NULL DEFAULT '',
    leased_until timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (scope, id)
);
CREATE INDEX {{.KeysExpiresIndex}} ON {{.Keys}} (expires_at);
