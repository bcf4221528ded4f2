-- API keys: only the SHA-256 of each secret is stored.
CREATE TABLE api_keys (
    id           bigserial PRIMARY KEY,
    name         text NOT NULL UNIQUE,
    secret_hash  text NOT NULL UNIQUE,
    scopes       text[] NOT NULL,
    machine      text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz,
    revoked_at   timestamptz
);

-- One row per activity, updated in place; times are milliseconds since the epoch,
-- exactly as the snapshot JSON shows them.
CREATE TABLE activities (
    activity_id       text PRIMARY KEY,
    task_name         text NOT NULL,
    system_image      text,
    machine           text,
    cancel_url        text,
    state             text NOT NULL,
    progress          double precision,
    status            text,
    attempt           bigint NOT NULL,
    seq               bigint NOT NULL,
    cancel_requested  boolean NOT NULL DEFAULT false,
    error             text,
    last_event        text NOT NULL,
    created_ms        bigint NOT NULL,
    updated_ms        bigint NOT NULL,
    ended_ms          bigint,
    owner_key_id      bigint,
    start_fingerprint text NOT NULL,
    end_fingerprint   text
);
CREATE INDEX activities_newest ON activities (created_ms DESC, activity_id DESC);
CREATE INDEX activities_active ON activities (created_ms DESC, activity_id DESC) WHERE ended_ms IS NULL;
CREATE INDEX activities_finished ON activities (created_ms DESC, activity_id DESC) WHERE ended_ms IS NOT NULL;
CREATE INDEX activities_machine ON activities (machine, created_ms DESC, activity_id DESC);
CREATE INDEX activities_ended ON activities (ended_ms) WHERE ended_ms IS NOT NULL;

-- One row per accepted change: the history streams replay after Last-Event-ID.
CREATE TABLE activity_events (
    activity_id     text NOT NULL,
    seq             bigint NOT NULL,
    event           text NOT NULL,
    data            text NOT NULL,
    idempotency_key text,
    created_ms      bigint NOT NULL,
    PRIMARY KEY (activity_id, seq)
);
CREATE UNIQUE INDEX activity_events_idempotency ON activity_events (activity_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
