-- The feed's retention horizon (contract section 8): the highest position whose change was
-- pruned. A feed resuming with a Last-Event-ID below it may have missed a deleted change
-- and is answered `event: reset` (then the initial set). One row, only ever raised.
CREATE TABLE feed_horizon (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    position  bigint NOT NULL DEFAULT 0
);
INSERT INTO feed_horizon DEFAULT VALUES;
