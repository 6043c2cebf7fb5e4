-- The git worktree a session works in (`session/open {isolation: "worktree"}`), as JSON:
-- {repo, path, branch, base, origin_cwd}; NULL: the session works in its cwd as given.
ALTER TABLE sessions ADD COLUMN worktree TEXT NULL;
