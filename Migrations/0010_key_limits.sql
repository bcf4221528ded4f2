-- Limits per key and devices that belong to their key (contract section 6).
--
-- A device registration is now (key, device token): each key sees, changes and forgets only
-- its own, and a second key naming the same device token makes a registration of its own.
-- Pushes are deduplicated by token when they are queued (DeviceRepository), so a phone two
-- keys registered still gets each push once.
--
-- Rows registered before this migration have no key (key_id NULL). They are kept: their
-- activity tokens go on receiving updates until their activities end (a Live Activity on a
-- phone keeps working across the upgrade), but no key sees, changes or deletes them, they
-- get no push-to-start (no key that may read made them), and the device retention prunes
-- them once nobody has refreshed them for DISPATCH_DEVICE_RETENTION_DAYS. An app that
-- registers again with its key makes its own registration (see docs/keys.md).
ALTER TABLE devices DROP CONSTRAINT devices_token_mac_key;
CREATE UNIQUE INDEX devices_key_token ON devices (key_id, token_mac);
-- The device retention: registrations nobody refreshed.
CREATE INDEX devices_updated ON devices (updated_at);

-- DISPATCH_MAX_LIVE_PER_KEY: the starts statement counts a key's live activities here.
CREATE INDEX activities_live_owner ON activities (owner_key_id) WHERE ended_ms IS NULL;

-- How many of `wanted[i]` new live activities key `keys[i]` may start now, at most
-- `max_live` live at once; admin keys (and starts without a key) are not limited and not
-- returned. Takes a transaction-level advisory lock per key first, in the order given
-- (callers sort), so the starts of one key are serialised across every session and server
-- until their transaction ends; the count then runs with a fresh snapshot (this function is
-- VOLATILE: each of its queries sees what committed before it ran, under READ COMMITTED), so
-- it includes every start of the key committed before the lock was granted. Ends never take
-- the lock: an end committing meanwhile only makes the count higher than the truth, never
-- lower. Hence a key never has more than max_live live activities.
CREATE FUNCTION dispatch_live_quota(keys bigint[], wanted integer[], max_live integer)
RETURNS TABLE (key_id bigint, allowed integer)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    i integer;
    live bigint;
BEGIN
    FOR i IN 1 .. coalesce(array_length(keys, 1), 0) LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM api_keys k WHERE k.id = keys[i] AND 'admin' = ANY (k.scopes));
        PERFORM pg_advisory_xact_lock(7345110, (keys[i] % 2147483647)::integer);
        SELECT count(*) INTO live FROM activities a WHERE a.owner_key_id = keys[i] AND a.ended_ms IS NULL;
        key_id := keys[i];
        allowed := GREATEST(0, LEAST(wanted[i]::bigint, max_live - live))::integer;
        RETURN NEXT;
    END LOOP;
END
$$;
