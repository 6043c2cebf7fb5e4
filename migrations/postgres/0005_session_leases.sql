-- Cluster mode: which node owns a session's actor, until when, and under which epoch. A
-- takeover (of an expired lease) bumps the epoch; every write of an owner carries its epoch
-- and is refused once the row holds another, so a paused old owner cannot write after a
-- takeover. A released lease is expired, never deleted, so epochs only grow.

CREATE TABLE session_leases (
    session_id TEXT PRIMARY KEY REFERENCES sessions (session_id) ON DELETE CASCADE,
    node_id    TEXT NOT NULL,
    epoch      BIGINT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
