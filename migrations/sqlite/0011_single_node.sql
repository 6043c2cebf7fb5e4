-- A SQLite file serves one node: the cluster's tables (leases, nodes) live on PostgreSQL only.

DROP TABLE session_leases;
DROP TABLE cluster_nodes;
