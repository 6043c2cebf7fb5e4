//! Applies a parsed patch to the workspace all-or-nothing: every hunk is matched and every
//! file's new content computed in memory first, then the writes run, undone should one fail.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::TOOL;
use super::parse::{FileOp, Hunk, Patch};
use crate::builtin::text_edit::{
    EditError, MAX_FILE_BYTES, Replacement, TextFile, clip, describe_miss, old_lines, seek,
    without_trailing_blanks,
};
use crate::fs_safe::FsError;
use crate::tools::{ToolError, ToolResult, Workspace};

/// Applies an Update's hunks to a file's bytes in memory, exactly as `apply_patch` computes a
/// file's new content before it writes anything: the new bytes, or why they cannot be made
/// (not UTF-8, or which hunk failed and why).
pub fn apply_update(bytes: &[u8], hunks: &[Hunk]) -> Result<Vec<u8>, EditError> {
    let file = TextFile::parse(bytes).ok_or(EditError::NotText)?;
    apply_hunks(&file, hunks)
}

/// Applies an Update's hunks to a file's text; the error says which hunk failed and why.
fn apply_hunks(file: &TextFile, hunks: &[Hunk]) -> Result<Vec<u8>, EditError> {
    let texts = file.texts();
    let mut cursor = 0;
    let mut replacements = Vec::with_capacity(hunks.len());
    for (index, hunk) in hunks.iter().enumerate() {
        let number = index + 1;
        let label = format!("hunk {number} (patch line {})", hunk.line);
        for anchor in &hunk.anchors {
            match seek(&texts, &[anchor.as_str()], cursor, false) {
                Some((at, _)) => cursor = at + 1,
                None => {
                    let mut message =
                        format!("{label}: anchor `@@ {}` was not found", clip(anchor));
                    if cursor > 0 {
                        message.push_str(&format!(" at or after line {}", cursor + 1));
                    }
                    message.push_str(". The anchor must be a whole line of the file.");
                    return Err(EditError::NoMatch {
                        hunk: number,
                        explanation: message,
                    });
                }
            }
        }
        if old_lines(&hunk.lines).is_empty() {
            let at = if hunk.anchors.is_empty() || hunk.end_of_file {
                texts.len()
            } else {
                cursor
            };
            replacements.push(Replacement::from_hunk(at, &hunk.lines));
            continue;
        }
        let mut lines = hunk.lines.as_slice();
        let found = loop {
            if let Some((at, _)) = seek(&texts, &old_lines(lines), cursor, hunk.end_of_file) {
                break Some(at);
            }
            match without_trailing_blanks(lines) {
                Some(shorter) => lines = shorter,
                None => break None,
            }
        };
        let Some(at) = found else {
            let old = old_lines(&hunk.lines);
            let end = if hunk.end_of_file {
                " (it is marked `*** End of File`, so it must match the file's last lines)"
            } else {
                ""
            };
            return Err(EditError::NoMatch {
                hunk: number,
                explanation: format!(
                    "{label} did not match{end}.\n{}",
                    describe_miss(&texts, &old, cursor)
                ),
            });
        };
        let replacement = Replacement::from_hunk(at, lines);
        cursor = at + replacement.old_len();
        replacements.push(replacement);
    }
    // Codex's rule, which models trained on its tool expect: an updated file ends with a newline.
    file.render(replacements, Some(true))
}

/// One filesystem change of a planned patch, with what undoes it.
#[derive(Debug, Clone)]
pub(super) enum Step {
    /// Writes `contents`; `before` is the file's content beforehand (`None`: it did not exist).
    Write {
        path: PathBuf,
        contents: Vec<u8>,
        before: Option<Vec<u8>>,
    },
    /// Removes a file whose content was `before`.
    Remove { path: PathBuf, before: Vec<u8> },
    /// Moves a file.
    Rename { from: PathBuf, to: PathBuf },
}

/// What a patch does, for the result.
#[derive(Debug, Default)]
pub(super) struct Summary {
    added: Vec<String>,
    modified: Vec<String>,
    moved: Vec<(String, String)>,
    deleted: Vec<String>,
    first_changed: Option<PathBuf>,
}

impl Summary {
    fn touch(&mut self, path: &Path) {
        self.first_changed.get_or_insert_with(|| path.to_path_buf());
    }
}

/// The workspace as the patch sees it part-way through: files the patch already changed in
/// memory, the rest read from disk on demand.
struct Overlay<'a> {
    ws: &'a Workspace,
    files: HashMap<PathBuf, Option<Vec<u8>>>,
}

impl Overlay<'_> {
    /// The file's current content; `None` when it does not exist.
    fn get(&mut self, rel: &Path) -> Result<Option<Vec<u8>>, FsError> {
        if let Some(state) = self.files.get(rel) {
            return Ok(state.clone());
        }
        let state = match self.ws.read(rel, MAX_FILE_BYTES) {
            Ok(bytes) => Some(bytes),
            Err(FsError::NotFound(_)) => None,
            Err(err) => return Err(err),
        };
        self.files.insert(rel.to_path_buf(), state.clone());
        Ok(state)
    }

    /// Whether anything (a file, directory, …) is at `rel`; symlinks on the way are errors.
    fn exists(&self, rel: &Path) -> Result<bool, FsError> {
        if let Some(state) = self.files.get(rel) {
            return Ok(state.is_some());
        }
        match self.ws.open_root()?.metadata(rel) {
            Ok(_) => Ok(true),
            Err(FsError::NotFound(_)) => Ok(false),
            Err(err) => Err(err),
        }
    }

    fn set(&mut self, rel: &Path, state: Option<Vec<u8>>) {
        self.files.insert(rel.to_path_buf(), state);
    }
}

fn shown(rel: &Path) -> String {
    rel.to_string_lossy().into_owned()
}

/// A planning failure: nothing was written.
fn refuse(kind: &'static str, message: impl std::fmt::Display) -> ToolError {
    ToolError::model(kind, format!("{TOOL}: {message}\nNo file was changed."))
}

fn fs_refusal(op: &str, path: &str, err: FsError) -> ToolError {
    refuse(err.kind(), format!("{op} `{path}`: {err}"))
}

/// Checks every operation and computes every file's new content in memory; touches nothing.
pub(super) fn plan(ws: &Workspace, patch: &Patch) -> Result<(Vec<Step>, Summary), ToolError> {
    let mut overlay = Overlay {
        ws,
        files: HashMap::new(),
    };
    let mut steps = Vec::new();
    let mut summary = Summary::default();
    let resolve = |op: &str, path: &str| {
        let rel = ws.resolve(path).map_err(|e| fs_refusal(op, path, e))?;
        if rel.as_os_str().is_empty() {
            return Err(refuse(
                "invalid_input",
                format!("{op} `{path}`: the path names the workspace root, not a file"),
            ));
        }
        Ok(rel)
    };
    for op in &patch.ops {
        match op {
            FileOp::Add { path, contents } => {
                let what = "Add File";
                let rel = resolve(what, path)?;
                if overlay
                    .exists(&rel)
                    .map_err(|e| fs_refusal(what, path, e))?
                {
                    return Err(refuse(
                        "already_exists",
                        format!(
                            "{what} `{path}`: the file already exists; use `*** Update File:` to \
                             change it (or delete it first)"
                        ),
                    ));
                }
                steps.push(Step::Write {
                    path: rel.clone(),
                    contents: contents.as_bytes().to_vec(),
                    before: None,
                });
                overlay.set(&rel, Some(contents.as_bytes().to_vec()));
                summary.added.push(shown(&rel));
                summary.touch(&rel);
            }
            FileOp::Delete { path } => {
                let what = "Delete File";
                let rel = resolve(what, path)?;
                let Some(before) = overlay.get(&rel).map_err(|e| fs_refusal(what, path, e))? else {
                    return Err(refuse(
                        "not_found",
                        format!("{what} `{path}`: the file does not exist"),
                    ));
                };
                steps.push(Step::Remove {
                    path: rel.clone(),
                    before,
                });
                overlay.set(&rel, None);
                summary.deleted.push(shown(&rel));
                summary.touch(&rel);
            }
            FileOp::Update {
                path,
                move_to,
                hunks,
            } => {
                let what = "Update File";
                let rel = resolve(what, path)?;
                let Some(before) = overlay.get(&rel).map_err(|e| fs_refusal(what, path, e))? else {
                    return Err(refuse(
                        "not_found",
                        format!(
                            "{what} `{path}`: the file does not exist; use `*** Add File:` to \
                             create it"
                        ),
                    ));
                };
                let after = if hunks.is_empty() {
                    before.clone()
                } else {
                    let file = TextFile::parse(&before).ok_or_else(|| {
                        refuse(
                            "invalid_input",
                            format!("{what} `{path}`: the file is not UTF-8 text"),
                        )
                    })?;
                    apply_hunks(&file, hunks)
                        .map_err(|why| refuse("no_match", format!("{what} `{path}`: {why}")))?
                };
                let target = match move_to {
                    Some(to) => Some((resolve("Move to", to)?, to)),
                    None => None,
                };
                match target {
                    Some((to_rel, to)) if to_rel != rel => {
                        if overlay
                            .exists(&to_rel)
                            .map_err(|e| fs_refusal("Move to", to, e))?
                        {
                            return Err(refuse(
                                "already_exists",
                                format!(
                                    "{what} `{path}`: the Move to target `{to}` already exists"
                                ),
                            ));
                        }
                        steps.push(Step::Rename {
                            from: rel.clone(),
                            to: to_rel.clone(),
                        });
                        summary.moved.push((shown(&rel), shown(&to_rel)));
                        if after != before {
                            steps.push(Step::Write {
                                path: to_rel.clone(),
                                contents: after.clone(),
                                before: Some(before),
                            });
                            summary.modified.push(shown(&to_rel));
                        }
                        overlay.set(&rel, None);
                        overlay.set(&to_rel, Some(after));
                        summary.touch(&to_rel);
                    }
                    _ => {
                        if after != before {
                            steps.push(Step::Write {
                                path: rel.clone(),
                                contents: after.clone(),
                                before: Some(before),
                            });
                            summary.modified.push(shown(&rel));
                            summary.touch(&rel);
                            overlay.set(&rel, Some(after));
                        }
                    }
                }
            }
        }
    }
    Ok((steps, summary))
}

/// A write that failed part-way, after the earlier steps were undone as far as possible.
#[derive(Debug)]
pub(super) struct StepFailure {
    pub(super) path: PathBuf,
    error: FsError,
    pub(super) restored: Vec<String>,
    pub(super) not_restored: Vec<(String, FsError)>,
}

/// Runs the steps in order; on a failure undoes the steps already done, newest first.
pub(super) fn run_steps(ws: &Workspace, steps: &[Step]) -> Result<(), StepFailure> {
    for (done, step) in steps.iter().enumerate() {
        let outcome = match step {
            Step::Write { path, contents, .. } => ws.write(TOOL, path, contents).map(drop),
            Step::Remove { path, .. } => ws.remove(TOOL, path),
            Step::Rename { from, to } => ws.rename(TOOL, from, to),
        };
        if let Err(error) = outcome {
            let path = match step {
                Step::Write { path, .. } | Step::Remove { path, .. } => path.clone(),
                Step::Rename { to, .. } => to.clone(),
            };
            let mut failure = StepFailure {
                path,
                error,
                restored: Vec::new(),
                not_restored: Vec::new(),
            };
            for step in steps[..done].iter().rev() {
                let (path, undone) = match step {
                    Step::Write {
                        path,
                        before: Some(before),
                        ..
                    } => (path, ws.write(TOOL, path, before).map(drop)),
                    Step::Write {
                        path, before: None, ..
                    } => (path, ws.remove(TOOL, path)),
                    Step::Remove { path, before } => (path, ws.write(TOOL, path, before).map(drop)),
                    Step::Rename { from, to } => (from, ws.rename(TOOL, to, from)),
                };
                match undone {
                    Ok(()) => failure.restored.push(shown(path)),
                    Err(err) => failure.not_restored.push((shown(path), err)),
                }
            }
            return Err(failure);
        }
    }
    Ok(())
}

/// The result of a write that failed: what failed, and what was rolled back or left part-way.
pub(super) fn failure_result(failure: StepFailure) -> ToolResult {
    let mut text = format!(
        "{TOOL}: writing `{}` failed: {}.",
        shown(&failure.path),
        failure.error
    );
    if failure.restored.is_empty() && failure.not_restored.is_empty() {
        text.push_str(" It was the first change, so no file was changed.");
    } else if failure.not_restored.is_empty() {
        text.push_str(&format!(
            " The changes already made were rolled back ({}), so no file was changed.",
            failure.restored.join(", ")
        ));
    } else {
        let broken: Vec<String> = failure
            .not_restored
            .iter()
            .map(|(path, err)| format!("{path} ({err})"))
            .collect();
        text.push_str(&format!(
            " Rolling back failed for: {}; these files are left part-way. Restored: {}.",
            broken.join(", "),
            if failure.restored.is_empty() {
                "none".to_string()
            } else {
                failure.restored.join(", ")
            }
        ));
    }
    let not_restored: Vec<&str> = failure
        .not_restored
        .iter()
        .map(|(p, _)| p.as_str())
        .collect();
    ToolResult::failure(text).with_metadata(json!({
        "error": {"kind": failure.error.kind()},
        "rolled_back": failure.restored,
        "not_restored": not_restored,
    }))
}

/// The result of an applied patch: every file added, moved, modified and deleted.
pub(super) fn success_result(summary: Summary) -> ToolResult {
    let mut text = String::new();
    for path in &summary.added {
        text.push_str(&format!("A {path}\n"));
    }
    for (from, to) in &summary.moved {
        text.push_str(&format!("R {from} -> {to}\n"));
    }
    // A moved file's line is its move, edited or not (as Codex prints it); `modified` in the
    // metadata still says its content changed.
    let moved_to = |path: &String| summary.moved.iter().any(|(_, to)| to == path);
    for path in summary.modified.iter().filter(|path| !moved_to(path)) {
        text.push_str(&format!("M {path}\n"));
    }
    for path in &summary.deleted {
        text.push_str(&format!("D {path}\n"));
    }
    let text = if text.is_empty() {
        "Success. The patch applied but changed no file (its hunks left every file as it was)."
            .to_string()
    } else {
        format!("Success. Updated the following files:\n{text}")
    };
    let moved: Vec<Value> = summary
        .moved
        .iter()
        .map(|(from, to)| json!({"from": from, "to": to}))
        .collect();
    let mut result = ToolResult::ok(text).with_metadata(json!({
        "added": summary.added,
        "modified": summary.modified,
        "moved": moved,
        "deleted": summary.deleted,
    }));
    result.file_modified = summary.first_changed;
    result
}
