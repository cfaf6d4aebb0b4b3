-- Webhook deliveries: at most one pending delivery per (event_type, ref_id);
-- delivered and failed rows are history and may repeat.
CREATE TABLE {{.Webhooks}} (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_type    text        NOT NULL,
    ref_id        text        NOT NULL,
    payload       bytea,
    status        text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
    attempt_count integer     NOT NULL DEFAULT 1,
    last_error    text        NOT NULL DEFAULT '',
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX {{.WebhooksPendingIndex}} ON {{.Webhooks}} (event_type, ref_id) WHERE status = 'pending';
