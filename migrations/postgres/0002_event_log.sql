-- An event append is one INSERT: the database itself keeps a session's `last_seq` and
-- `updated_at` in step with its events and refuses a `seq` that is not past `last_seq`, so a
-- batch of events from many sessions is one statement. The message below is matched by the
-- store to report a conflict; keep them the same. A missing session is left to the foreign key.

CREATE FUNCTION events_bump_session() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE sessions SET last_seq = NEW.seq, updated_at = NEW.created_at
     WHERE session_id = NEW.session_id AND last_seq < NEW.seq;
    IF NOT FOUND AND EXISTS (SELECT 1 FROM sessions WHERE session_id = NEW.session_id) THEN
        RAISE EXCEPTION 'event seq is not past last_seq'
            USING DETAIL = format('seq %s of session %s', NEW.seq, NEW.session_id);
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER events_bump_session BEFORE INSERT ON events
    FOR EACH ROW EXECUTE FUNCTION events_bump_session();

-- A session's `updated_at` changes with every event; in an index it would cost an index write
-- per event (and, on PostgreSQL, rule out heap-only updates). A user's sessions are few enough
-- to sort when listed.
DROP INDEX sessions_by_user;
CREATE INDEX sessions_of_user ON sessions (user_name);

-- Room on each page for the new versions of a session row, which every event makes.
ALTER TABLE sessions SET (fillfactor = 70);
