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
