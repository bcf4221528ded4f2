-- Feed positions (contract section 8): a number per change that grows in commit order across
-- every server process. A publish batch takes an advisory lock after its changes and only
-- then draws positions for them, holding the lock through its commit: a transaction becomes
-- visible before it releases its locks, so positions are handed out in visibility order and a
-- reader that has seen position P will never later see a smaller one appear. A rolled-back
-- batch leaves a harmless hole.
CREATE SEQUENCE feed_positions AS bigint;
ALTER TABLE activity_events ADD COLUMN position bigint;

-- Changes stored before positions existed get them now, in the order they were made.
UPDATE activity_events e SET position = p.position
FROM (SELECT activity_id, seq, nextval('feed_positions') AS position
      FROM (SELECT activity_id, seq FROM activity_events ORDER BY created_ms, activity_id, seq) ordered) p
WHERE e.activity_id = p.activity_id AND e.seq = p.seq;

CREATE UNIQUE INDEX activity_events_position ON activity_events (position);
