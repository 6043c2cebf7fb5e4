-- The agent profile (`[[agents]]` name) a session was opened with; NULL: none. Kept so the
-- session is the same kind of agent after a restart.
ALTER TABLE sessions ADD COLUMN agent TEXT NULL;
