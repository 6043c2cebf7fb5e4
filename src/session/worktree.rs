//! A session's own git worktree (`session/open {isolation: "worktree"}`): made on a new branch
//! under the user's root, ended by `session/merge` or `session/discard`. The repository is the
//! agent's to write, so its config, hooks and filters are the agent's too: every git command
//! here runs confined in the session's sandbox, with hooks and fsmonitor switched off, exactly
//! as the agent's own `git` would.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::SessionError;
use crate::builtin::process::sandboxed_command;
use crate::store::SessionWorktree;
use crate::tools::workspace::Workspace;

/// Most bytes of each of git's streams kept: lists of paths, a merge's complaint.
const MAX_GIT_OUTPUT: usize = 4 * 1024 * 1024;

/// How a new session is kept apart from others working in the same checkout.
#[derive(serde::Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// In the cwd as given, shared with whoever else works there.
    None,
    /// In a git worktree of its own, on a new branch.
    Worktree,
}

/// The directory under the user's root that holds the sessions' worktrees.
pub const WORKTREES_DIR: &str = ".agentd-worktrees";

/// The longest a git command here may take (a checkout of a large repository included).
const GIT_TIMEOUT: Duration = Duration::from_secs(300);

/// Settings no repository config may change for the git commands run here: a hook, a
/// monitor or a pager would run a program of the repository's choosing.
const GIT_SAFETY: &[&str] = &[
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.pager=cat",
];

/// Who commits a session's pending changes when the repository names nobody.
const FALLBACK_IDENTITY: &[&str] = &[
    "-c",
    "user.name=agentd",
    "-c",
    "user.email=agentd@localhost",
];

/// Git run in a user's root, confined as the session's own commands are.
pub(crate) struct Git {
    /// The user's root as a workspace (with the session's sandbox, when there is one).
    workspace: Arc<Workspace>,
}

/// What one git command did.
struct Ran {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Ran {
    /// Git's own words on a failure: its last `fatal:`/`error:` line, else its last line.
    fn complaint(&self) -> String {
        let lines: Vec<&str> = self
            .stderr
            .lines()
            .chain(self.stdout.lines())
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .collect();
        lines
            .iter()
            .rev()
            .find(|line| line.starts_with("fatal:") || line.starts_with("error:"))
            .or(lines.last())
            .map_or_else(|| "git failed".to_string(), |line| (*line).to_string())
    }
}

impl Git {
    /// Git over the user's root `workspace`.
    pub(crate) fn new(workspace: Arc<Workspace>) -> Self {
        Self { workspace }
    }

    fn root(&self) -> &Path {
        self.workspace.root()
    }

    /// Runs `git args` in `dir` (relative to the user's root); each stream is kept up to
    /// [`MAX_GIT_OUTPUT`], since the repository (and so what git prints) is the user's.
    async fn run(&self, dir: &Path, args: &[&str]) -> Result<Ran, SessionError> {
        let mut argv: Vec<&OsStr> = GIT_SAFETY.iter().map(OsStr::new).collect();
        argv.extend(args.iter().map(OsStr::new));
        let mut command = sandboxed_command(
            &self.workspace,
            OsStr::new("git"),
            &argv,
            &self.root().join(dir),
            &[],
        )
        .map_err(|err| SessionError::InvalidParams(format!("cannot run git: {err}")))?;
        command.env("GIT_TERMINAL_PROMPT", "0");
        let output = tokio::time::timeout(
            GIT_TIMEOUT,
            crate::capped_read::output(&mut command, MAX_GIT_OUTPUT),
        )
        .await
        .map_err(|_| {
            SessionError::InvalidParams(format!(
                "git {} took longer than {} s",
                args.first().copied().unwrap_or_default(),
                GIT_TIMEOUT.as_secs()
            ))
        })?
        .map_err(|err| SessionError::InvalidParams(format!("cannot run git: {err}")))?;
        Ok(Ran {
            ok: output.status.success(),
            stdout: String::from_utf8_lossy(&output.stdout.bytes).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr.bytes).into_owned(),
        })
    }

    /// Runs `git args` in `dir` and answers its stdout, or git's complaint after `doing`.
    async fn must(&self, dir: &Path, args: &[&str], doing: &str) -> Result<String, SessionError> {
        let ran = self.run(dir, args).await?;
        if ran.ok {
            Ok(ran.stdout)
        } else {
            Err(SessionError::InvalidParams(format!(
                "{doing}: {}",
                ran.complaint()
            )))
        }
    }

    /// The `-c` settings that name a committer in `dir`: none when the repository names one,
    /// else a fallback, since the sandbox's `HOME` holds no global identity.
    async fn identity(&self, dir: &Path) -> Result<Vec<&'static str>, SessionError> {
        let named = self.run(dir, &["config", "user.email"]).await?.ok;
        Ok(if named {
            Vec::new()
        } else {
            FALLBACK_IDENTITY.to_vec()
        })
    }

    /// Commits everything changed in the worktree `tree` as `message`; nothing when nothing
    /// changed.
    async fn commit_all(&self, tree: &Path, message: &str) -> Result<(), SessionError> {
        self.must(tree, &["add", "-A"], "cannot stage the changes")
            .await?;
        if self.run(tree, &["diff", "--cached", "--quiet"]).await?.ok {
            return Ok(());
        }
        let mut args = self.identity(tree).await?;
        args.extend(["commit", "-q", "--no-verify", "-m", message]);
        self.must(tree, &args, "cannot commit the changes").await?;
        Ok(())
    }

    /// Makes the worktree of session `session_id`, whose requested cwd is `cwd` (relative to
    /// the user's root and inside a git repository), on a new branch from `base` (`HEAD` when
    /// `None`). Answers the worktree and the session's cwd inside it.
    pub(crate) async fn create(
        &self,
        session_id: &str,
        cwd: &Path,
        base: Option<&str>,
    ) -> Result<(SessionWorktree, PathBuf), SessionError> {
        let base = base.unwrap_or("HEAD");
        if base.is_empty() || base.starts_with('-') || base.chars().any(char::is_control) {
            return Err(SessionError::InvalidParams(format!(
                "base: {base:?} is not a commit, branch or tag name"
            )));
        }
        let repo = repository_of(self.root(), cwd).ok_or_else(|| {
            SessionError::InvalidParams(format!(
                "isolation \"worktree\": cwd {:?} is not inside a git repository",
                cwd.display().to_string()
            ))
        })?;
        if repo.starts_with(WORKTREES_DIR) {
            return Err(SessionError::InvalidParams(
                "isolation \"worktree\": cwd is already another session's worktree".into(),
            ));
        }
        let holder = self.root().join(WORKTREES_DIR);
        std::fs::create_dir_all(&holder)
            .and_then(|()| {
                // `*` in its own directory hides the worktrees from a checkout that holds them
                // (a repository at the user's root), and itself too.
                let ignore = holder.join(".gitignore");
                match ignore.symlink_metadata() {
                    Ok(_) => Ok(()),
                    Err(_) => std::fs::write(ignore, "*\n"),
                }
            })
            .map_err(|err| {
                SessionError::InvalidParams(format!("cannot make {WORKTREES_DIR}: {err}"))
            })?;
        let path = Path::new(WORKTREES_DIR).join(session_id);
        let branch = format!("agentd/{session_id}");
        let target = self.root().join(&path);
        let target = target.to_string_lossy();
        self.must(
            &repo,
            &["worktree", "add", "-q", "-b", &branch, &target, base],
            "isolation \"worktree\": cannot make the worktree",
        )
        .await?;
        // `join("")` would add a trailing slash.
        let cwd_inside = match cwd.strip_prefix(&repo) {
            Ok(below) if !below.as_os_str().is_empty() => path.join(below),
            _ => path.clone(),
        };
        let worktree = SessionWorktree {
            repo: repo.to_string_lossy().into_owned(),
            path: path.to_string_lossy().into_owned(),
            branch,
            base: base.to_string(),
            origin_cwd: cwd.to_string_lossy().into_owned(),
        };
        Ok((worktree, cwd_inside))
    }

    /// Commits what the session left in its worktree to its branch and merges the branch into
    /// what the repository's checkout has checked out, then removes the worktree and branch.
    /// A merge that cannot complete is undone and answered as `MergeConflict`, the worktree
    /// kept.
    pub(crate) async fn merge(
        &self,
        worktree: &SessionWorktree,
        message: &str,
    ) -> Result<Value, SessionError> {
        let tree = Path::new(&worktree.path);
        let repo = Path::new(&worktree.repo);
        if !self.root().join(tree).is_dir() {
            return Err(SessionError::InvalidParams(format!(
                "the worktree {} is gone; discard it instead",
                worktree.path
            )));
        }
        self.commit_all(tree, message).await?;
        let mut args = self.identity(repo).await?;
        let title = format!("Merge {}", worktree.branch);
        args.extend(["merge", "--no-ff", "-m", &title, worktree.branch.as_str()]);
        let merged = self.run(repo, &args).await?;
        if !merged.ok {
            let conflicts = self
                .run(repo, &["diff", "--name-only", "--diff-filter=U"])
                .await?
                .stdout;
            let conflicts: Vec<&str> = conflicts.lines().filter(|l| !l.is_empty()).collect();
            // Whatever the merge began is taken back; without MERGE_HEAD this is a no-op.
            let _ = self.run(repo, &["merge", "--abort"]).await;
            let why = if conflicts.is_empty() {
                merged.complaint()
            } else {
                format!("conflicts in {}", conflicts.join(", "))
            };
            return Err(SessionError::MergeConflict(format!(
                "cannot merge {} into {}: {why}; nothing was changed, the worktree is kept",
                worktree.branch, worktree.repo
            )));
        }
        let commit = self
            .must(repo, &["rev-parse", "HEAD"], "cannot read the merge")
            .await?;
        self.remove(worktree).await;
        Ok(json!({
            "merged": true,
            "branch": worktree.branch,
            "commit": commit.trim(),
            "cwd": worktree.origin_cwd,
        }))
    }

    /// The commit the worktree's branch is at now.
    pub(crate) async fn head(&self, worktree: &SessionWorktree) -> Result<String, SessionError> {
        let head = self
            .must(
                Path::new(&worktree.path),
                &["rev-parse", "HEAD"],
                "cannot read the worktree's branch",
            )
            .await?;
        Ok(head.trim().to_string())
    }

    /// Ends a sub-agent's worktree: commits what it left (as `message`) to its branch and
    /// removes the worktree. The branch is kept, with its commit answered, when it moved past
    /// `start`; otherwise it goes too and the answer is `None`.
    pub(crate) async fn settle(
        &self,
        worktree: &SessionWorktree,
        start: &str,
        message: &str,
    ) -> Result<Option<String>, SessionError> {
        let tree = Path::new(&worktree.path);
        if self.root().join(tree).is_dir() {
            self.commit_all(tree, message).await?;
        }
        let repo = Path::new(&worktree.repo);
        let head = self
            .run(
                repo,
                &["rev-parse", "--verify", "-q", worktree.branch.as_str()],
            )
            .await?;
        let head = head.stdout.trim().to_string();
        if head.is_empty() || head == start {
            self.remove(worktree).await;
            return Ok(None);
        }
        self.remove_tree(worktree).await;
        Ok(Some(head))
    }

    /// Removes the worktree's directory and git's record of it (forgetting it, when the
    /// directory went already); its branch stays.
    async fn remove_tree(&self, worktree: &SessionWorktree) {
        let repo = Path::new(&worktree.repo);
        let target = self.root().join(&worktree.path);
        let target = target.to_string_lossy();
        let removed = self
            .run(repo, &["worktree", "remove", "--force", "--force", &target])
            .await;
        if !matches!(&removed, Ok(ran) if ran.ok) {
            let _ = std::fs::remove_dir_all(self.root().join(&worktree.path));
            let _ = self.run(repo, &["worktree", "prune"]).await;
        }
    }

    /// Removes the worktree and its branch, whatever they hold.
    pub(crate) async fn discard(&self, worktree: &SessionWorktree) -> Value {
        self.remove(worktree).await;
        json!({"discarded": true, "branch": worktree.branch, "cwd": worktree.origin_cwd})
    }

    /// Removes the worktree (forgetting it, when its directory went already) and its branch;
    /// failures are logged, since nothing the session needs is left in either.
    async fn remove(&self, worktree: &SessionWorktree) {
        let repo = Path::new(&worktree.repo);
        self.remove_tree(worktree).await;
        match self
            .run(repo, &["branch", "-q", "-D", worktree.branch.as_str()])
            .await
        {
            Ok(ran) if ran.ok => {}
            Ok(ran) => {
                tracing::warn!(branch = %worktree.branch, error = %ran.complaint(), "cannot delete a session's branch")
            }
            Err(err) => {
                tracing::warn!(branch = %worktree.branch, %err, "cannot delete a session's branch")
            }
        }
    }
}

/// The nearest directory from `cwd` up to the user's root (both relative to `root`) that
/// holds a `.git`, relative to `root`.
fn repository_of(root: &Path, cwd: &Path) -> Option<PathBuf> {
    let mut dir = Some(cwd);
    while let Some(here) = dir {
        if root.join(here).join(".git").symlink_metadata().is_ok() {
            return Some(here.to_path_buf());
        }
        dir = here.parent();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_repository_is_the_nearest_directory_with_a_git_entry() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("a/b/c")).unwrap();
        std::fs::create_dir_all(root.path().join("a/.git")).unwrap();
        assert_eq!(
            repository_of(root.path(), Path::new("a/b/c")),
            Some(PathBuf::from("a"))
        );
        // A linked worktree or submodule has a `.git` file.
        std::fs::write(root.path().join("a/b/.git"), "gitdir: elsewhere").unwrap();
        assert_eq!(
            repository_of(root.path(), Path::new("a/b/c")),
            Some(PathBuf::from("a/b"))
        );
        assert_eq!(repository_of(root.path(), Path::new("x")), None);
        std::fs::create_dir_all(root.path().join(".git")).unwrap();
        assert_eq!(
            repository_of(root.path(), Path::new("x/y")),
            Some(PathBuf::new())
        );
    }

    #[test]
    fn gits_complaint_is_its_fatal_line() {
        let ran = Ran {
            ok: false,
            stdout: String::new(),
            stderr: "Preparing worktree\nfatal: invalid reference: nope\nhint: x\n".into(),
        };
        assert_eq!(ran.complaint(), "fatal: invalid reference: nope");
    }
}
