-- The initial schema. Every query names its columns, so later migrations may add columns (with
-- defaults) and tables without touching these. Never edit a migration once released: add the
-- next numbered file instead (the checksum of applied migrations is verified at start-up).
--
-- Timestamps are UTC RFC 3339 TEXT of fixed width (microseconds, `Z`), so text order is time
-- order. JSON is TEXT. Booleans are INTEGER 0/1.

CREATE TABLE users (
    name       TEXT NOT NULL PRIMARY KEY,
    created_at TEXT NOT NULL
) STRICT;

CREATE TABLE sessions (
    session_id TEXT NOT NULL PRIMARY KEY,
    user_name  TEXT NULL REFERENCES users (name),
    title      TEXT NULL,
    cwd        TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    last_seq   INTEGER NOT NULL DEFAULT 0
) STRICT;

CREATE INDEX sessions_by_user ON sessions (user_name, updated_at);

CREATE TABLE events (
    session_id TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    seq        INTEGER NOT NULL,
    method     TEXT NOT NULL,
    params     TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
) STRICT;

CREATE TABLE messages (
    session_id TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    idx        INTEGER NOT NULL,
    message    TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (session_id, idx)
) STRICT;

CREATE TABLE tasks (
    task_id      TEXT NOT NULL PRIMARY KEY,
    session_id   TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    tool_call_id TEXT NOT NULL,
    tool_name    TEXT NOT NULL,
    state        TEXT NOT NULL,
    exit_code    INTEGER NULL,
    reason       TEXT NULL,
    total_bytes  INTEGER NOT NULL DEFAULT 0,
    output_path  TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    finished_at  TEXT NULL
) STRICT;

CREATE INDEX tasks_by_session ON tasks (session_id, created_at);
CREATE INDEX tasks_by_state ON tasks (state);

CREATE TABLE cost_rows (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id   TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    node_id      TEXT NOT NULL,
    model        TEXT NOT NULL,
    reserved_usd REAL NOT NULL,
    actual_usd   REAL NOT NULL,
    tokens_in    INTEGER NOT NULL,
    tokens_out   INTEGER NOT NULL,
    committed    INTEGER NOT NULL,
    turn_id      TEXT NULL,
    task_id      TEXT NULL,
    created_at   TEXT NOT NULL
) STRICT;

CREATE INDEX cost_rows_by_session ON cost_rows (session_id, created_at);
