-- Forks: a session knows the session it was forked from, and each history message the event
-- seq the session had reached when it was written, so a fork can take the history up to an
-- event. Messages written before this migration read as written at seq 0.

ALTER TABLE sessions ADD COLUMN parent_session_id TEXT NULL
    REFERENCES sessions (session_id) ON DELETE SET NULL;
ALTER TABLE messages ADD COLUMN event_seq BIGINT NOT NULL DEFAULT 0;
