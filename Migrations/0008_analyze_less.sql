-- Auto-analyze sampled and sorted every snapshot's JSON in the history and every status line,
-- though no query filters on them: about a fifth of the database's CPU under a steady stream
-- of publishes. Columns nothing filters or joins on get no statistics; the append-only
-- history is analysed after it grew by half rather than a tenth; and activities, whose
-- progress updates each count as a change, after five times their number of changes.
ALTER TABLE activity_events ALTER COLUMN data SET STATISTICS 0;
ALTER TABLE activity_events SET (autovacuum_analyze_scale_factor = 0.5);
ALTER TABLE activities
    ALTER COLUMN task_name SET STATISTICS 0,
    ALTER COLUMN system_image SET STATISTICS 0,
    ALTER COLUMN cancel_url SET STATISTICS 0,
    ALTER COLUMN status SET STATISTICS 0,
    ALTER COLUMN error SET STATISTICS 0,
    ALTER COLUMN start_fingerprint SET STATISTICS 0,
    ALTER COLUMN end_fingerprint SET STATISTICS 0,
    ALTER COLUMN cancel_reason SET STATISTICS 0;
ALTER TABLE activities SET (autovacuum_analyze_scale_factor = 5);
