-- Cluster mode: the nodes, how the others reach each one, when it was last heard from, and
-- whether it is draining (it takes no sessions then). A node renews its row with its leases.

CREATE TABLE cluster_nodes (
    node_id       TEXT PRIMARY KEY,
    advertise_url TEXT NOT NULL,
    seen_at       TIMESTAMPTZ NOT NULL,
    draining      BOOLEAN NOT NULL DEFAULT FALSE
);
