-- History rows were checked against their activity one by one: the foreign key
-- activity_events_activity ran a referential-integrity trigger per inserted row (a
-- `SELECT ... FOR KEY SHARE` on activities), about 8-10 us of PostgreSQL CPU per change in a
-- publish batch of 500 (a quarter of the batch's own statements; measured with
-- log_statement_stats, issue 35). The check cannot fail: every history row is written by the
-- finalize step of a publish batch, which inserts a change only for an activity row the same
-- transaction has just written and still locks (`xmin` is the transaction's own id), so the
-- activity exists and nobody can delete it before the commit.
--
-- What the key also did, deleting an activity's history with the activity (retention, an
-- operator's DELETE), is kept by one statement-level trigger: one DELETE per deleting
-- statement over its transition table, run at the statement's end like the cascade was, so a
-- statement that reads the history beside its DELETE (retention's feed horizon) still sees it.
ALTER TABLE activity_events DROP CONSTRAINT activity_events_activity;

CREATE FUNCTION activity_events_follow_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM activity_events e USING gone g WHERE e.activity_id = g.activity_id;
    RETURN NULL;
END $$;

CREATE TRIGGER activities_delete_history AFTER DELETE ON activities
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION activity_events_follow_delete();
