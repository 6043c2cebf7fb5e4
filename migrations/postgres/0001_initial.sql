-- The initial schema. Every query names its columns, so later migrations may add columns (with
-- defaults) and tables without touching these. Never edit a migration once released: add the
-- next numbered file instead (the checksum of applied migrations is verified at start-up).
--
-- Tables go into the first schema of the connection's search_path.

CREATE TABLE users (
    name       TEXT NOT NULL PRIMARY KEY,
    created_at TIMESTAMPTZ NOT NULL
);

CREATE TABLE sessions (
    session_id TEXT NOT NULL PRIMARY KEY,
    user_name  TEXT NULL REFERENCES users (name),
    title      TEXT NULL,
    cwd        TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    last_seq   BIGINT NOT NULL DEFAULT 0
);

CREATE INDEX sessions_by_user ON sessions (user_name, updated_at);

CREATE TABLE events (
    session_id TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    seq        BIGINT NOT NULL,
    method     TEXT NOT NULL,
    params     JSONB NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (session_id, seq)
);

CREATE TABLE messages (
    session_id TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    idx        BIGINT NOT NULL,
    message    JSONB NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (session_id, idx)
);

CREATE TABLE tasks (
    task_id      TEXT NOT NULL PRIMARY KEY,
    session_id   TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    tool_call_id TEXT NOT NULL,
    tool_name    TEXT NOT NULL,
    state        TEXT NOT NULL,
    exit_code    INTEGER NULL,
    reason       TEXT NULL,
    total_bytes  BIGINT NOT NULL DEFAULT 0,
    output_path  TEXT NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL,
    finished_at  TIMESTAMPTZ NULL
);

CREATE INDEX tasks_by_session ON tasks (session_id, created_at);
CREATE INDEX tasks_by_state ON tasks (state);

CREATE TABLE cost_rows (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id   TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    node_id      TEXT NOT NULL,
    model        TEXT NOT NULL,
    reserved_usd DOUBLE PRECISION NOT NULL,
    actual_usd   DOUBLE PRECISION NOT NULL,
    tokens_in    BIGINT NOT NULL,
    tokens_out   BIGINT NOT NULL,
    committed    BOOLEAN NOT NULL,
    turn_id      TEXT NULL,
    task_id      TEXT NULL,
    created_at   TIMESTAMPTZ NOT NULL
);

CREATE INDEX cost_rows_by_session ON cost_rows (session_id, created_at);
