-- Rules the application already relies on, stated where PostgreSQL enforces them.
ALTER TABLE activities
    ADD CONSTRAINT activities_state_known
        CHECK (state IN ('queued', 'processing', 'retrying', 'idle', 'completed', 'error', 'cancelled', 'rejected')),
    ADD CONSTRAINT activities_progress_range CHECK (progress IS NULL OR (progress >= 0 AND progress <= 1)),
    ADD CONSTRAINT activities_seq_positive CHECK (seq >= 1),
    ADD CONSTRAINT activities_attempt_positive CHECK (attempt >= 1),
    -- ended_ms is set exactly when the activity reached a terminal state.
    ADD CONSTRAINT activities_ended_iff_terminal
        CHECK ((ended_ms IS NULL) = (state IN ('queued', 'processing', 'retrying', 'idle')));

ALTER TABLE activity_events ADD CONSTRAINT activity_events_seq_positive CHECK (seq >= 1);

-- History belongs to its activity: pruning an activity takes its history with it.
DELETE FROM activity_events e WHERE NOT EXISTS (SELECT 1 FROM activities a WHERE a.activity_id = e.activity_id);
ALTER TABLE activity_events ADD CONSTRAINT activity_events_activity
    FOREIGN KEY (activity_id) REFERENCES activities (activity_id) ON DELETE CASCADE;

-- activities_newest already serves "finished, newest first" (ended_ms IS NOT NULL filters it).
DROP INDEX activities_finished;

-- Room on each page for the new row version of an update, so progress updates (which change
-- no indexed column) stay heap-only (HOT). Applies to pages written from now on.
ALTER TABLE activities SET (fillfactor = 85);
