-- The previous holder (docs/design.md, "The state machine", rule 2): the
-- token of the claim that ended by a failure or a release before the
-- current holder took the key over, so that a retry of that failure or
-- release still answers OK. Empty when there is none.
ALTER TABLE {{.Keys}} ADD COLUMN ptok text NOT NULL DEFAULT '';
