-- Cluster mode: the nodes (PostgreSQL only; kept here so both backends have one schema).

CREATE TABLE cluster_nodes (
    node_id       TEXT PRIMARY KEY,
    advertise_url TEXT NOT NULL,
    seen_at       TEXT NOT NULL,
    draining      INTEGER NOT NULL DEFAULT 0
);
