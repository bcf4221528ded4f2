-- The feed's sequencer (NATS carrier, contract section 10): publish transactions write their
-- history rows with position NULL and take no lock shared by every writer; one leader among
-- all server processes numbers the committed rows in passes, one at a time (see
-- Sources/DispatchCore/Carrier/SequencerMachine.swift). This index is what a pass walks: only
-- the rows still waiting, so it stays small however long the history grows.
CREATE INDEX activity_events_unnumbered ON activity_events (activity_id, seq) WHERE position IS NULL;
