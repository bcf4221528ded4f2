-- What the phone shows is always true (issue 37; contract sections 5.2, 5.4, 5.5).
--
-- stale_date: the stale-date (Unix seconds) the last push of the activity carried to its
-- phones (0: none yet). stale_refresh_ms: a touch moved the deadline at least half of
-- staleAfter past it (when, in ms; 0: nothing asked): the entry (or channel) is due for an
-- update with the same content-state and the new stale-date, paced like progress. A push
-- claimed after the touch clears it.
ALTER TABLE push_activity_outbox ADD COLUMN stale_date bigint NOT NULL DEFAULT 0,
                                 ADD COLUMN stale_refresh_ms bigint NOT NULL DEFAULT 0;
DROP INDEX push_activity_outbox_due;
CREATE INDEX push_activity_outbox_due ON push_activity_outbox (due_at) WHERE wanted_seq > sent_seq OR stale_refresh_ms > 0;

ALTER TABLE broadcast_outbox ADD COLUMN stale_date bigint NOT NULL DEFAULT 0,
                             ADD COLUMN stale_refresh_ms bigint NOT NULL DEFAULT 0;

-- A channel whose push APNs refused was flagged failed and never pushed nor deleted again:
-- it goes on (and is deleted after its activity's dismissal date).
UPDATE broadcast_outbox SET phase = 'live', due_at = now() WHERE phase = 'failed' AND channel_id IS NOT NULL;

-- The push-to-start budget per device (DISPATCH_PUSH_TO_START_LIMIT in any hour): the starts
-- a device was sent in the last hour, counted from its rows.
CREATE INDEX push_outbox_starts ON push_outbox (device_id, sent_at) WHERE kind = 'start';
