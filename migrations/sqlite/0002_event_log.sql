-- An event append is one INSERT: the database itself keeps a session's `last_seq` and
-- `updated_at` in step with its events and refuses a `seq` that is not past `last_seq`, so a
-- batch of events from many sessions is one statement. The message below is matched by the
-- store to report a conflict; keep them the same.
--
-- Events and messages are only ever found by their primary key, so they become WITHOUT ROWID
-- tables: one B-tree each instead of a table plus its key index, half the pages an append
-- writes.

CREATE TABLE events_by_key (
    session_id TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    seq        INTEGER NOT NULL,
    method     TEXT NOT NULL,
    params     TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
) STRICT, WITHOUT ROWID;
INSERT INTO events_by_key (session_id, seq, method, params, created_at)
    SELECT session_id, seq, method, params, created_at FROM events;
DROP TABLE events;
ALTER TABLE events_by_key RENAME TO events;

CREATE TABLE messages_by_key (
    session_id TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    idx        INTEGER NOT NULL,
    message    TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (session_id, idx)
) STRICT, WITHOUT ROWID;
INSERT INTO messages_by_key (session_id, idx, message, created_at)
    SELECT session_id, idx, message, created_at FROM messages;
DROP TABLE messages;
ALTER TABLE messages_by_key RENAME TO messages;

CREATE TRIGGER events_seq_in_order BEFORE INSERT ON events
WHEN NEW.seq <= (SELECT last_seq FROM sessions WHERE session_id = NEW.session_id)
BEGIN
    SELECT RAISE(ABORT, 'event seq is not past last_seq');
END;

CREATE TRIGGER events_bump_session AFTER INSERT ON events
BEGIN
    UPDATE sessions SET last_seq = NEW.seq, updated_at = NEW.created_at
     WHERE session_id = NEW.session_id;
END;

-- A session's `updated_at` changes with every event; in an index it would cost an index write
-- per event (and, on PostgreSQL, rule out heap-only updates). A user's sessions are few enough
-- to sort when listed.
DROP INDEX sessions_by_user;
CREATE INDEX sessions_of_user ON sessions (user_name);
