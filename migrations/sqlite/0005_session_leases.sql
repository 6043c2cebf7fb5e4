-- Cluster mode: which node owns a session's actor, until when, and under which epoch (see the
-- PostgreSQL migration of the same name). SQLite serves one node, so its leases are always
-- its own; the table keeps both backends passing one store suite.

CREATE TABLE session_leases (
    session_id TEXT PRIMARY KEY REFERENCES sessions (session_id) ON DELETE CASCADE,
    node_id    TEXT NOT NULL,
    epoch      INTEGER NOT NULL,
    expires_at TEXT NOT NULL
);
