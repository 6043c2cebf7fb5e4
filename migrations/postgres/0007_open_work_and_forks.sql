-- `live_from_seq`: the seq a session had reached before the first event appended since it was
-- last known to hold no open work (a running turn, a call, an approval, a task). Set by the
-- event trigger, cleared when an actor unloads with nothing open and after start-up (or a
-- takeover) has ended what a stopped node left open; so those read only the newest events.
-- Not indexed, so the per-event update stays heap-only.
--
-- `inherited_usd`: for a fork, what its source had spent up to the fork point (its own
-- inherited share included), shown beside the fork's own spend and never counted in it.

ALTER TABLE sessions ADD COLUMN live_from_seq BIGINT NULL;
ALTER TABLE sessions ADD COLUMN inherited_usd DOUBLE PRECISION NOT NULL DEFAULT 0;

-- Sessions stored before this migration may hold work a stopped server left open; the next
-- start reads their last thousand events for it (an open turn ends within that many).
UPDATE sessions SET live_from_seq = GREATEST(last_seq - 1000, 0) WHERE last_seq > 0;

CREATE OR REPLACE FUNCTION events_bump_session() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE sessions SET last_seq = NEW.seq, updated_at = NEW.created_at,
           live_from_seq = COALESCE(live_from_seq, NEW.seq - 1)
     WHERE session_id = NEW.session_id AND last_seq < NEW.seq;
    IF NOT FOUND AND EXISTS (SELECT 1 FROM sessions WHERE session_id = NEW.session_id) THEN
        RAISE EXCEPTION 'event seq is not past last_seq'
            USING DETAIL = format('seq %s of session %s', NEW.seq, NEW.session_id);
    END IF;
    RETURN NEW;
END;
$$;
