-- Recovery points (guard.Step).
-- The Store keeps a pending or failed key's steps with its record: steps
-- holds them in order, each a uvarint length + name and a uvarint length +
-- result (the Redis record's encoding), step_count how many. Completion
-- clears them.
ALTER TABLE {{.Keys}}
    ADD COLUMN steps      bytea,
    ADD COLUMN step_count integer NOT NULL DEFAULT 0 CHECK (step_count >= 0);
-- Steps committed by Backstop.CommitStep in the business transaction: one
-- row per key and step name, so a step's effect is committed once.
CREATE TABLE {{.Steps}} (
    scope      text        NOT NULL,
    id         text        NOT NULL,
    name       text        NOT NULL,
    result     bytea       NOT NULL,
    fence      bigint      NOT NULL CHECK (fence > 0),
    token      text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (scope, id, name)
);
CREATE INDEX {{.StepsExpiresIndex}} ON {{.Steps}} (expires_at);
