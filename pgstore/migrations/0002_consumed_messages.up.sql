-- Consumed messages: a message id is processed once per consumer group.
CREATE TABLE {{.Consumed}} (
    consumer_group text        NOT NULL,
    message_id     text        NOT NULL,
    consumed_at    timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL,
    CONSTRAINT {{.ConsumedUnique}} UNIQUE (consumer_group, message_id)
);
CREATE INDEX {{.ConsumedExpiresIndex}} ON {{.Consumed}} (expires_at);
