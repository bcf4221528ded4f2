-- A touch records when it happened instead of moving the indexed stale deadline: updates of
-- progress and touches then change no indexed column and stay heap-only (HOT). The stale
-- deadline (`stale_at_ms`, indexed) is when the sweeper looks next; the real one is
-- max(updated_ms, touched_ms) + stale_after_s, worked out by the sweeper.
ALTER TABLE activities ADD COLUMN touched_ms bigint;
