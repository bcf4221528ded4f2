-- Remote cancel (contract section 5.3) and stale activities (5.4).
ALTER TABLE activities
    ADD COLUMN cancel_reason text,
    -- Seconds without an accepted change after which the server ends the activity; 0: never.
    ADD COLUMN stale_after_s integer NOT NULL DEFAULT 0 CHECK (stale_after_s >= 0),
    -- When it goes stale (ms since epoch); null when finished or never.
    ADD COLUMN stale_at_ms bigint;
CREATE INDEX activities_stale ON activities (stale_at_ms) WHERE stale_at_ms IS NOT NULL;

-- Signed webhook deliveries to an activity's cancelURL, retried for up to a day, at least once;
-- every attempt carries the same delivery id so receivers can de-duplicate.
CREATE TABLE webhook_outbox (
    id              bigserial PRIMARY KEY,
    delivery_id     text NOT NULL UNIQUE,
    activity_id     text NOT NULL,
    url             text NOT NULL,
    body            text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    due_at          timestamptz NOT NULL DEFAULT now(),
    give_up_at      timestamptz NOT NULL DEFAULT now() + interval '24 hours',
    attempts        integer NOT NULL DEFAULT 0,
    lease_id        bigint,
    lease_until     timestamptz,
    state           text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
    last_status     text,
    delivered_at    timestamptz
);
CREATE INDEX webhook_outbox_due ON webhook_outbox (due_at) WHERE state = 'pending';
