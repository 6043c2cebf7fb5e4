-- Cost rows say how many of a call's prompt tokens the provider served from its prompt cache
-- (priced at `cached_input_per_mtok`). Rows written before this migration read as 0.

ALTER TABLE cost_rows ADD COLUMN tokens_cached INTEGER NOT NULL DEFAULT 0;
