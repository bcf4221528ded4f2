-- DISPATCH_MAX_FINISHED_PER_KEY (issue 36): one key churning start+end (well under its live
-- limit) made 3,308 finished activities in 20 s, and every feed's initial set (contract §8:
-- live activities and those finished in the last 24 hours) carried all of them. A key may
-- now finish at most max_finished activities in any 24 hours: a start is refused while the
-- key already has that many finished in the window, so one key's share of every initial set
-- is bounded (by its live limit plus this one).
--
-- The starts statement counts a key's recent ends here: an index-only scan of at most
-- max_finished entries, in the batch that carries the starts (no extra round trip).
CREATE INDEX activities_finished_owner ON activities (owner_key_id, ended_ms) WHERE ended_ms IS NOT NULL;

-- How many of `wanted[i]` new activities key `keys[i]` may start now: at most `max_live`
-- live at once (as dispatch_live_quota, Migrations/0010_key_limits.sql, whose lock and fresh
-- snapshot this keeps) and fewer than `max_finished` finished since `since_ms` (the start of
-- the window). Admin keys (and starts without a key) are not limited and not returned.
-- `finished_full`: the finished count is what refuses (a refusal names that limit);
-- `free_at_ms`: when the window will have dropped enough of the key's ends for one more start
-- (the oldest of its newest `max_finished` ends leaves the window then), for Retry-After.
-- Ends never take the lock: an end committing meanwhile only makes the live count higher than
-- the truth, and the finished count lower by as many ends as race (at most the key's live
-- activities), so a key has at most max_finished + max_live finished in a window.
CREATE FUNCTION dispatch_start_quota(keys bigint[], wanted integer[], max_live integer,
                                     max_finished integer, since_ms bigint)
RETURNS TABLE (key_id bigint, allowed integer, finished_full boolean, free_at_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    i integer;
    live bigint;
    finished bigint;
    oldest bigint;
BEGIN
    FOR i IN 1 .. coalesce(array_length(keys, 1), 0) LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM api_keys k WHERE k.id = keys[i] AND 'admin' = ANY (k.scopes));
        PERFORM pg_advisory_xact_lock(7345110, (keys[i] % 2147483647)::integer);
        SELECT count(*) INTO live FROM activities a WHERE a.owner_key_id = keys[i] AND a.ended_ms IS NULL;
        SELECT count(*), min(r.ended_ms) INTO finished, oldest FROM (
            SELECT a.ended_ms FROM activities a
            WHERE a.owner_key_id = keys[i] AND a.ended_ms IS NOT NULL AND a.ended_ms >= since_ms
            ORDER BY a.ended_ms DESC LIMIT max_finished) r;
        key_id := keys[i];
        allowed := GREATEST(0, LEAST(wanted[i]::bigint, max_live - live, max_finished - finished))::integer;
        finished_full := allowed < wanted[i] AND max_finished - finished <= max_live - live;
        free_at_ms := oldest;
        RETURN NEXT;
    END LOOP;
END
$$;
