-- The model a session uses (`<provider>/<model>`; NULL: the server's default) and the
-- reasoning effort it asked for, chosen at `session/open` and kept across restarts.
ALTER TABLE sessions ADD COLUMN model TEXT NULL;
ALTER TABLE sessions ADD COLUMN reasoning_effort TEXT NULL;
