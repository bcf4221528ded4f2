-- The feed's initial set (contract section 8) walks every activity in the order of the
-- position of its latest change. activity_events' position index holds every change, so a
-- page had to step over all the superseded ones (with 100,000 activities of three changes
-- each, the first page stepped over 200,000 rows: 2.5 s). This table keeps one row per
-- activity, its latest position, and is indexed by it: a page reads about the rows it sends.
--
-- It is kept by statement-level triggers, whichever statement gives a change its position
-- (the insert of a publish batch, or a later UPDATE that assigns positions): one upsert per
-- statement over its transition table, never a per-row trigger. Rows whose position is
-- still NULL are ignored until they get one. Its cost on writes, measured (5,000 one-row
-- INSERT statements in a loop): about 15-20 us of database time per inserting statement.
CREATE TABLE feed_latest (
    activity_id text PRIMARY KEY REFERENCES activities (activity_id) ON DELETE CASCADE,
    position    bigint NOT NULL
);
CREATE UNIQUE INDEX feed_latest_position ON feed_latest (position);
ALTER TABLE feed_latest SET (fillfactor = 90);

CREATE FUNCTION feed_latest_keep() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO feed_latest (activity_id, position)
    SELECT DISTINCT ON (activity_id) activity_id, position
    FROM changed WHERE position IS NOT NULL
    ORDER BY activity_id, position DESC
    ON CONFLICT (activity_id) DO UPDATE SET position = EXCLUDED.position
        WHERE feed_latest.position < EXCLUDED.position;
    RETURN NULL;
END $$;

CREATE TRIGGER feed_latest_on_insert AFTER INSERT ON activity_events
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION feed_latest_keep();
CREATE TRIGGER feed_latest_on_update AFTER UPDATE ON activity_events
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION feed_latest_keep();

INSERT INTO feed_latest (activity_id, position)
SELECT DISTINCT ON (activity_id) activity_id, position
FROM activity_events WHERE position IS NOT NULL
ORDER BY activity_id, position DESC;
