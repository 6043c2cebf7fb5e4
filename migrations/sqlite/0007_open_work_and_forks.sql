-- `live_from_seq`: the seq a session had reached before the first event appended since it was
-- last known to hold no open work (a running turn, a call, an approval, a task). Set by the
-- event trigger, cleared when an actor unloads with nothing open and after start-up has ended
-- what a stopped server left open; so start-up reads only those sessions' newest events.
-- Not indexed: the column changes with many events, and the sessions table is scanned once.
--
-- `inherited_usd`: for a fork, what its source had spent up to the fork point (its own
-- inherited share included), shown beside the fork's own spend and never counted in it.

ALTER TABLE sessions ADD COLUMN live_from_seq INTEGER NULL;
ALTER TABLE sessions ADD COLUMN inherited_usd REAL NOT NULL DEFAULT 0;

-- Sessions stored before this migration may hold work a stopped server left open; the next
-- start reads their last thousand events for it (an open turn ends within that many).
UPDATE sessions SET live_from_seq = MAX(last_seq - 1000, 0) WHERE last_seq > 0;

DROP TRIGGER events_bump_session;
CREATE TRIGGER events_bump_session AFTER INSERT ON events
BEGIN
    UPDATE sessions SET last_seq = NEW.seq, updated_at = NEW.created_at,
           live_from_seq = COALESCE(live_from_seq, NEW.seq - 1)
     WHERE session_id = NEW.session_id;
END;
