-- Live Activity pushes (contract section 5.1-5.2). Tokens are sealed with AES-256-GCM under the
-- deployment's token key and found by an HMAC of the token, never stored in the clear.
ALTER TABLE activities ADD COLUMN live_activity boolean NOT NULL DEFAULT false;

CREATE TABLE devices (
    id                  bigserial PRIMARY KEY,
    token_mac           bytea NOT NULL UNIQUE,
    token_sealed        bytea NOT NULL,
    -- The token's last four hex digits, to tell devices apart in listings and logs.
    token_hint          text NOT NULL,
    push_to_start_mac   bytea,
    push_to_start_sealed bytea,
    push_to_start_hint  text,
    -- When the push-to-start token was last registered: a 410 older than this does not retire it.
    push_to_start_at    timestamptz,
    key_id              bigint,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- The per-activity update token a device registered for an activity's Live Activity.
CREATE TABLE activity_tokens (
    device_id      bigint NOT NULL REFERENCES devices (id) ON DELETE CASCADE,
    activity_id    text NOT NULL,
    token_mac      bytea NOT NULL,
    token_sealed   bytea NOT NULL,
    token_hint     text NOT NULL,
    -- When the token was last registered: a 410 older than this does not retire it.
    registered_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (device_id, activity_id)
);
CREATE INDEX activity_tokens_activity ON activity_tokens (activity_id);

-- The push outbox: one row per (activity, device, kind) that wants the device to hold the
-- activity's newest state. A change marks the rows of every device with a token for the
-- activity (in the change's own transaction); a sender claims due rows (SKIP LOCKED, with a
-- lease), reads the snapshot current after its claim, pushes it, and records which seq it
-- pushed. Changes that arrive while a push waits are coalesced into it: the phone needs the
-- newest state.
--
-- Every push rewrites its row a few times, so the table is kept cheap to update: two indexes
-- only (no surrogate id; forgetting a device, which is rare, scans), and a change to a row
-- already waiting to be claimed writes nothing (see ActivityRepository.finalizeStatement).
-- A claim moves due_at to its lease's end: the due scan then skips rows being sent without
-- visiting them, and finds them again by itself if their sender dies.
CREATE TABLE push_outbox (
    activity_id     text NOT NULL,
    device_id       bigint NOT NULL REFERENCES devices (id) ON DELETE CASCADE,
    kind            text NOT NULL CHECK (kind IN ('start', 'update')),
    wanted_seq      bigint NOT NULL,
    sent_seq        bigint NOT NULL DEFAULT 0,
    priority        smallint NOT NULL DEFAULT 5 CHECK (priority IN (5, 10)),
    -- When the oldest change not yet pushed was committed (latency metric), ms since epoch.
    pending_since_ms bigint,
    due_at          timestamptz NOT NULL DEFAULT now(),
    attempts        integer NOT NULL DEFAULT 0,
    -- The claim that holds the row (from push_leases) and until when; every write of a
    -- sender is fenced by it. A sender that died leaves it to run out.
    lease_id        bigint,
    lease_until     timestamptz,
    last_timestamp  bigint NOT NULL DEFAULT 0,
    last_status     text,
    failed          boolean NOT NULL DEFAULT false,
    sent_at         timestamptz,
    PRIMARY KEY (activity_id, device_id, kind)
) WITH (
    -- A queue: rows are rewritten several times a second and few are live. Vacuum it as soon
    -- as a few thousand versions are dead, without throttling, or scans wade through them.
    autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000,
    autovacuum_vacuum_cost_delay = 0, autovacuum_analyze_scale_factor = 0.05
);
CREATE INDEX push_outbox_due ON push_outbox (due_at) WHERE wanted_seq > sent_seq AND NOT failed;
CREATE SEQUENCE push_leases AS bigint;
