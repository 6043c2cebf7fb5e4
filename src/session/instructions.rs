//! What the repository and the operator tell the agent: the operator's `[instructions]`, the
//! `AGENTS.md` files from the user's workspace root down to the session's cwd, and the list
//! of the skills found on the way, all in the system prompt of the session's turns.
//!
//! Gathered again when each turn starts, so an edited file counts from the next turn; the
//! prompt is built the same way from the same files, so its bytes (and the provider's prompt
//! cache) stay as they were while nothing changed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::builtin::skill::{MAX_SKILL_BYTES, Skill, split_front_matter};
use crate::fs_safe;

/// The file a directory's instructions are read from, unless the override is there.
pub const AGENTS_FILE: &str = "AGENTS.md";
/// Read instead of [`AGENTS_FILE`] in a directory that has it.
pub const AGENTS_OVERRIDE_FILE: &str = "AGENTS.override.md";
/// Where skills live in any directory between the root and the cwd: `<dir>/<name>/SKILL.md`.
pub const SKILL_DIRS: [&str; 2] = [".agents/skills", ".claude/skills"];

/// `[instructions]`: what every session's agent is told besides the built-in prompt.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct InstructionsConfig {
    /// Most bytes of `AGENTS.md` text taken, root first; the file that passes it is cut.
    pub max_bytes: usize,
    /// The operator's own instructions, before the repository's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// A file holding the operator's instructions, read at start-up, after `text`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
}

impl Default for InstructionsConfig {
    fn default() -> Self {
        Self {
            max_bytes: 32 * 1024,
            text: None,
            file: None,
        }
    }
}

/// `[instructions]` as sessions use it: the operator's text read once, and the budget.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperatorInstructions {
    /// `text`, then the contents of `file`.
    pub text: Option<String>,
    /// `max_bytes`.
    pub max_bytes: usize,
}

/// `[instructions] file` could not be read.
#[derive(Debug, thiserror::Error)]
#[error("instructions.file {}: {source}", file.display())]
pub struct InstructionsError {
    /// The file.
    pub file: std::path::PathBuf,
    /// Why.
    #[source]
    pub source: std::io::Error,
}

impl InstructionsConfig {
    /// The operator's instructions, `file` read now; an unreadable file is an error.
    pub fn load(&self) -> Result<OperatorInstructions, InstructionsError> {
        let mut text = self.text.clone().unwrap_or_default();
        if let Some(file) = &self.file {
            let read = std::fs::read_to_string(file).map_err(|source| InstructionsError {
                file: file.clone(),
                source,
            })?;
            if !text.is_empty() {
                text.push_str("\n\n");
            }
            text.push_str(&read);
        }
        Ok(OperatorInstructions {
            text: (!text.trim().is_empty()).then_some(text),
            max_bytes: self.max_bytes,
        })
    }
}

/// One source of the instructions, as `session/open` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstructionSource {
    /// The file, relative to the user's workspace root; `[instructions]` for the operator's.
    pub path: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Whether less than all of it was taken (the `max_bytes` budget ran out).
    pub cut: bool,
}

/// What a session's turns are told, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gathered {
    /// The system prompt: the built-in one, then the operator's, the repository's and the
    /// skills list.
    pub prompt: Arc<str>,
    /// Each source, in the order it is in the prompt.
    pub sources: Vec<InstructionSource>,
    /// The skills found, by name, the nearest to the cwd winning.
    pub skills: Vec<Skill>,
}

/// Reads the instructions for a session whose root is `cwd` (relative to `anchor`), walking
/// from `user_root` (relative to `anchor`, an ancestor of `cwd` or `cwd` itself) down.
/// Files are read without following symlinks; an unreadable one is skipped with a warning.
pub fn gather(
    base_prompt: &str,
    operator: Option<&str>,
    max_bytes: usize,
    anchor: &Path,
    user_root: &Path,
    cwd: &Path,
) -> Gathered {
    let mut prompt = base_prompt.to_string();
    let mut sources = Vec::new();
    if let Some(text) = operator.filter(|text| !text.trim().is_empty()) {
        prompt.push_str("\n\n# Instructions from the operator\n\n");
        prompt.push_str(text.trim_end());
        sources.push(InstructionSource {
            path: "[instructions]".into(),
            bytes: text.len() as u64,
            cut: false,
        });
    }
    let dirs = walk(user_root, cwd);
    let mut left = max_bytes;
    for dir in &dirs {
        let Some((name, bytes)) = [AGENTS_OVERRIDE_FILE, AGENTS_FILE]
            .iter()
            .find_map(|name| read(anchor, &dir.join(name), u64::MAX).map(|b| (*name, b)))
        else {
            continue;
        };
        let text = String::from_utf8_lossy(&bytes);
        let taken = cut_at(&text, left);
        let shown = dir
            .strip_prefix(user_root)
            .unwrap_or(dir)
            .join(name)
            .display()
            .to_string();
        sources.push(InstructionSource {
            path: shown.clone(),
            bytes: bytes.len() as u64,
            cut: taken.len() < text.len(),
        });
        left -= taken.len();
        if !taken.trim().is_empty() {
            prompt.push_str(&format!(
                "\n\n# {shown} (instructions of the repository)\n\n"
            ));
            prompt.push_str(taken.trim_end());
            if taken.len() < text.len() {
                prompt.push_str("\n[cut: the instructions passed their size limit here]");
            }
        }
    }
    let skills = skills_in(anchor, &dirs);
    if !skills.is_empty() {
        prompt.push_str(
            "\n\n# Skills\n\nLoad a skill with the `skill` tool when the task calls for it; \
             its instructions then follow.\n",
        );
        for skill in &skills {
            prompt.push_str(&format!("\n- {}: {}", skill.name, skill.description));
        }
    }
    Gathered {
        prompt: prompt.into(),
        sources,
        skills,
    }
}

/// The directories from `root` down to `cwd`, both included, root first.
fn walk(root: &Path, cwd: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![root.to_path_buf()];
    if let Ok(below) = cwd.strip_prefix(root) {
        let mut at = root.to_path_buf();
        for part in below.components() {
            at.push(part);
            dirs.push(at.clone());
        }
    }
    dirs
}

/// The longest prefix of `text` of at most `limit` bytes that ends on a character boundary.
fn cut_at(text: &str, limit: usize) -> &str {
    if text.len() <= limit {
        return text;
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn read(anchor: &Path, rel: &Path, limit: u64) -> Option<Vec<u8>> {
    match fs_safe::read_no_follow(anchor, rel, limit) {
        Ok(bytes) => Some(bytes),
        Err(fs_safe::FsError::NotFound(_)) => None,
        Err(err) => {
            tracing::warn!(path = %rel.display(), %err, "instructions file skipped");
            None
        }
    }
}

/// The front matter of a `SKILL.md`.
#[derive(Deserialize)]
struct FrontMatter {
    name: String,
    description: String,
}

/// The skills under the skill directories of `dirs`, by name, a nearer directory's winning.
fn skills_in(anchor: &Path, dirs: &[PathBuf]) -> Vec<Skill> {
    let mut found: std::collections::BTreeMap<String, Skill> = Default::default();
    for dir in dirs {
        for skills_dir in SKILL_DIRS {
            let skills_dir = dir.join(skills_dir);
            let Ok(entries) = fs_safe::list_dir_no_follow(anchor, &skills_dir) else {
                continue;
            };
            for entry in entries {
                if entry.kind != fs_safe::EntryKind::Dir {
                    continue;
                }
                let skill_dir = skills_dir.join(&entry.name);
                let Some(bytes) = read(anchor, &skill_dir.join("SKILL.md"), MAX_SKILL_BYTES) else {
                    continue;
                };
                let text = String::from_utf8_lossy(&bytes);
                let parsed = split_front_matter(&text)
                    .and_then(|(front, _)| serde_norway::from_str::<FrontMatter>(front).ok());
                let Some(front) = parsed else {
                    tracing::warn!(path = %skill_dir.display(), "SKILL.md without a name and description in its front matter; skipped");
                    continue;
                };
                found.insert(
                    front.name.clone(),
                    Skill {
                        name: front.name,
                        description: front
                            .description
                            .split_whitespace()
                            .collect::<Vec<_>>()
                            .join(" "),
                        dir: skill_dir,
                    },
                );
            }
        }
    }
    found.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn agents_files_go_root_first_an_override_wins_and_the_budget_cuts() {
        let dir = tempfile::tempdir().unwrap();
        let anchor = dir.path();
        write(anchor, "alice/AGENTS.md", "Root rules.\n");
        write(
            anchor,
            "alice/app/AGENTS.md",
            "ignored: the override wins\n",
        );
        write(anchor, "alice/app/AGENTS.override.md", "App rules.\n");
        write(
            anchor,
            "alice/app/src/AGENTS.md",
            "Deep rules that run long.\n",
        );
        write(anchor, "AGENTS.md", "above the user's root: never read\n");
        let gather_now = || {
            gather(
                "BASE",
                Some("Operator rules."),
                "Root rules.\n".len() + "App rules.\n".len() + 4,
                anchor,
                Path::new("alice"),
                Path::new("alice/app/src"),
            )
        };
        let gathered = gather_now();
        let prompt = &*gathered.prompt;
        assert!(prompt.starts_with("BASE\n\n# Instructions from the operator\n\nOperator rules."));
        let root = prompt.find("Root rules.").unwrap();
        let app = prompt.find("App rules.").unwrap();
        let deep = prompt.find("Deep").unwrap();
        assert!(root < app && app < deep, "{prompt}");
        assert!(
            !prompt.contains("ignored") && !prompt.contains("never read"),
            "{prompt}"
        );
        assert!(!prompt.contains("rules that run long"), "{prompt}");
        assert!(prompt.contains("[cut:"), "{prompt}");
        let paths: Vec<(&str, bool)> = gathered
            .sources
            .iter()
            .map(|s| (s.path.as_str(), s.cut))
            .collect();
        assert_eq!(
            paths,
            [
                ("[instructions]", false),
                ("AGENTS.md", false),
                ("app/AGENTS.override.md", false),
                ("app/src/AGENTS.md", true),
            ]
        );
        // The same files give the same bytes.
        assert_eq!(gather_now(), gathered);
    }

    #[test]
    fn a_symlinked_agents_file_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "secret.txt", "the neighbour's secret");
        std::fs::create_dir_all(dir.path().join("bob")).unwrap();
        std::os::unix::fs::symlink(
            dir.path().join("secret.txt"),
            dir.path().join("bob/AGENTS.md"),
        )
        .unwrap();
        let gathered = gather(
            "B",
            None,
            1000,
            dir.path(),
            Path::new("bob"),
            Path::new("bob"),
        );
        assert_eq!(&*gathered.prompt, "B");
        assert!(gathered.sources.is_empty());
    }

    #[test]
    fn skills_are_listed_by_name_and_description_the_nearest_winning() {
        let dir = tempfile::tempdir().unwrap();
        let anchor = dir.path();
        write(
            anchor,
            "u/.agents/skills/release/SKILL.md",
            "---\nname: release\ndescription: >\n  Cut a release:\n  tag and publish.\n---\nStep one: BODY-TEXT.\n",
        );
        write(
            anchor,
            "u/p/.claude/skills/release/SKILL.md",
            "---\nname: release\ndescription: The nearer release skill.\n---\nNEARER-BODY\n",
        );
        write(
            anchor,
            "u/.agents/skills/broken/SKILL.md",
            "no front matter\n",
        );
        let gathered = gather("B", None, 1000, anchor, Path::new("u"), Path::new("u/p"));
        assert_eq!(gathered.skills.len(), 1);
        assert_eq!(gathered.skills[0].description, "The nearer release skill.");
        assert_eq!(
            gathered.skills[0].dir,
            Path::new("u/p/.claude/skills/release")
        );
        assert!(
            gathered
                .prompt
                .contains("- release: The nearer release skill.")
        );
        assert!(!gathered.prompt.contains("BODY"), "{}", gathered.prompt);
        let (front, body) =
            split_front_matter("---\nname: a\ndescription: b\n---\nthe body\n").unwrap();
        assert_eq!((front, body), ("name: a\ndescription: b", "the body\n"));
    }
}
