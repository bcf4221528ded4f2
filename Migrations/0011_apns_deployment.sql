-- APNs as one deployment (contract section 5.1, 5.2, 5.5).
--
-- One provider token (the ES256 JWT) for every process and server: whichever sender needs a
-- token first makes it under an advisory lock and stores it here, sealed like device tokens;
-- the others read it. Apple answers 429 TooManyProviderTokenUpdates to a team whose token
-- changes more often than every 20 minutes.
CREATE TABLE apns_provider_tokens (
    team_id       text NOT NULL,
    key_id        text NOT NULL,
    jwt_mac       bytea NOT NULL,
    jwt_sealed    bytea NOT NULL,
    -- The JWT's iat, Unix seconds.
    issued_at     bigint NOT NULL,
    -- Sending waits until then (Unix seconds) after TooManyProviderTokenUpdates.
    paused_until  bigint,
    PRIMARY KEY (team_id, key_id)
);

-- The APNs environment of the app build that registered the device: its tokens are pushed
-- to that environment's host.
ALTER TABLE devices ADD COLUMN environment text NOT NULL DEFAULT 'production'
    CHECK (environment IN ('production', 'sandbox'));

-- Broadcast channels (contract section 5.5): the start's wish, and the channel once made.
-- channel_id is set by the sender, not by a change: no seq, no event.
ALTER TABLE activities ADD COLUMN broadcast boolean NOT NULL DEFAULT false,
                       ADD COLUMN channel_id text;

-- One row per broadcast activity, driving its channel's life through the sender: create
-- (before any push that needs the channel), live (one push per change, coalesced like the
-- push outbox), delete (after the end and its dismissal date), then the row goes; failed
-- when APNs refused to make the channel (the activity runs without one). The publish path
-- raises wanted_seq; a sender claims due rows under a lease, as for push_outbox.
CREATE TABLE broadcast_outbox (
    activity_id      text PRIMARY KEY,
    phase            text NOT NULL DEFAULT 'create' CHECK (phase IN ('create', 'live', 'delete', 'failed')),
    environment      text CHECK (environment IN ('production', 'sandbox')),
    channel_id       text,
    wanted_seq       bigint NOT NULL DEFAULT 1,
    sent_seq         bigint NOT NULL DEFAULT 1,
    priority         smallint NOT NULL DEFAULT 5 CHECK (priority IN (5, 10)),
    pending_since_ms bigint,
    last_timestamp   bigint NOT NULL DEFAULT 0,
    due_at           timestamptz NOT NULL DEFAULT now(),
    attempts         integer NOT NULL DEFAULT 0,
    lease_id         bigint,
    lease_until      timestamptz,
    last_status      text,
    created_at       timestamptz NOT NULL DEFAULT now()
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000);
CREATE INDEX broadcast_outbox_due ON broadcast_outbox (due_at) WHERE phase <> 'failed';
