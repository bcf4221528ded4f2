-- Browser sessions (contract §7): a page trades its key once for an HttpOnly cookie. Only the
-- SHA-256 of the session secret is stored, as for keys. A session ends when unused for 12 hours
-- (last_used_at, written at most once a minute), when signed out (the row is deleted), and with
-- its key: lookups join api_keys and ignore revoked keys, and deleting a key deletes its sessions.
CREATE TABLE browser_sessions (
    secret_hash  text PRIMARY KEY,
    key_id       bigint NOT NULL REFERENCES api_keys (id) ON DELETE CASCADE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX browser_sessions_key ON browser_sessions (key_id);
CREATE INDEX browser_sessions_last_used ON browser_sessions (last_used_at);
