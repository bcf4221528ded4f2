-- Less database per push (issue 21, item 7): one outbox entry per activity instead of one
-- row per (activity, device). A change of an activity that has update tokens raises its
-- entry's wanted_seq (one row write per change, whatever the number of phones); a sender
-- claims due entries in batches under a lease, reads the activities and all their tokens in
-- one statement, pushes the newest state to every token from memory, and marks the entries
-- in one statement per batch.
--
-- push_outbox keeps the per-device rows that must exist: push-to-start (one per device by
-- nature), the first push to a newly registered token, and a device whose push failed
-- transiently (429, 5xx, no answer) and retries on its own backoff while the other phones
-- go on. A fan-out passes over a device whose row is pending (its retry carries the newest
-- state) or already pushed this seq, and raises that row's wanted_seq instead.
--
-- The pace (DISPATCH_PUSH_PACE) and timestamps are per activity: due_at after a push, and
-- last_timestamp, the aps.timestamp of the last fan-out.
CREATE TABLE push_activity_outbox (
    activity_id      text PRIMARY KEY,
    wanted_seq       bigint NOT NULL,
    sent_seq         bigint NOT NULL DEFAULT 0,
    priority         smallint NOT NULL DEFAULT 5 CHECK (priority IN (5, 10)),
    pending_since_ms bigint,
    due_at           timestamptz NOT NULL DEFAULT now(),
    attempts         integer NOT NULL DEFAULT 0,
    lease_id         bigint,
    lease_until      timestamptz,
    last_timestamp   bigint NOT NULL DEFAULT 0,
    -- The newest aps.timestamp a per-device row of the activity pushed: the next fan-out goes
    -- after it. Kept apart from last_timestamp, which the rows continue from, so that rows
    -- pushed in the same second to many phones do not ratchet each other ahead of the clock.
    row_timestamp    bigint NOT NULL DEFAULT 0,
    -- How many tokens the last fan-out pushed to, and when.
    last_devices     integer NOT NULL DEFAULT 0,
    last_status      text,
    sent_at          timestamptz
) WITH (
    -- A queue, like push_outbox: vacuumed early and unthrottled.
    autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000,
    autovacuum_vacuum_cost_delay = 0, autovacuum_analyze_scale_factor = 0.05
);
CREATE INDEX push_activity_outbox_due ON push_activity_outbox (due_at) WHERE wanted_seq > sent_seq;

-- Rows of the old shape waiting for a change are carried over as entries; the per-device
-- rows stay (settled ones are what the fan-out compares against).
INSERT INTO push_activity_outbox (activity_id, wanted_seq, sent_seq, priority, pending_since_ms, last_timestamp)
SELECT activity_id, max(wanted_seq), min(sent_seq), max(priority), min(pending_since_ms), max(last_timestamp)
FROM push_outbox WHERE kind = 'update' GROUP BY activity_id;
