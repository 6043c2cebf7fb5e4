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

use crate::builtin::skill::{Skill, split_front_matter};
use crate::fs_safe;

/// The file a directory's instructions are read from, unless the override is there.
pub const AGENTS_FILE: &str = "AGENTS.md";
/// Read instead of [`AGENTS_FILE`] in a directory that has it.
pub const AGENTS_OVERRIDE_FILE: &str = "AGENTS.override.md";
/// Where skills live in any directory between the root and the cwd: `<dir>/<name>/SKILL.md`.
pub const SKILL_DIRS: [&str; 2] = [".agents/skills", ".claude/skills"];
/// Most bytes of a `SKILL.md` read for the list: its front matter must lie within them.
pub const MAX_SKILL_FRONT_MATTER_BYTES: u64 = 8 * 1024;
/// Most bytes of a skill's description listed (Claude Code's limit); a longer one is cut.
pub const MAX_SKILL_DESCRIPTION_BYTES: usize = 1024;
/// Most bytes of a skill's name; a skill with a longer one is skipped.
pub const MAX_SKILL_NAME_BYTES: usize = 64;
/// Most bytes of the operator's `[instructions] file`.
const MAX_OPERATOR_FILE_BYTES: u64 = 1024 * 1024;

/// `[instructions]`: what every session's agent is told besides the built-in prompt.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct InstructionsConfig {
    /// Most bytes of `AGENTS.md` text and the skills list together, root first; the file or
    /// the list that passes it is cut.
    pub max_bytes: usize,
    /// Most skills listed; more are left out of the list, and the prompt says so.
    pub max_skills: usize,
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
            max_skills: 100,
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
    /// What the repository's files may add to the prompt.
    pub limits: InstructionLimits,
}

/// What a repository's instructions may add to a session's prompt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InstructionLimits {
    /// `max_bytes`: `AGENTS.md` text and the skills list together.
    pub max_bytes: usize,
    /// `max_skills`.
    pub max_skills: usize,
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
            let read = crate::capped_read::read_file_to_string(file, MAX_OPERATOR_FILE_BYTES)
                .map_err(|source| InstructionsError {
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
            limits: self.limits(),
        })
    }

    /// `max_bytes` and `max_skills`.
    pub fn limits(&self) -> InstructionLimits {
        InstructionLimits {
            max_bytes: self.max_bytes,
            max_skills: self.max_skills,
        }
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
///
/// Every file is read only as far as the budget left: a 1 TiB `AGENTS.md` costs what
/// `max_bytes` costs, and so do a thousand skills.
pub fn gather(
    base_prompt: &str,
    operator: Option<&str>,
    limits: InstructionLimits,
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
    let mut left = limits.max_bytes;
    for dir in &dirs {
        let Some((name, file)) = [AGENTS_OVERRIDE_FILE, AGENTS_FILE]
            .iter()
            .find_map(|name| read(anchor, &dir.join(name), left as u64).map(|f| (*name, f)))
        else {
            continue;
        };
        let text = String::from_utf8_lossy(&file.bytes);
        let taken = cut_at(&text, left);
        let cut = file.cut() || taken.len() < text.len();
        let shown = dir
            .strip_prefix(user_root)
            .unwrap_or(dir)
            .join(name)
            .display()
            .to_string();
        sources.push(InstructionSource {
            path: shown.clone(),
            bytes: file.size,
            cut,
        });
        left -= taken.len();
        if !taken.trim().is_empty() {
            prompt.push_str(&format!(
                "\n\n# {shown} (instructions of the repository)\n\n"
            ));
            prompt.push_str(taken.trim_end());
            if cut {
                prompt.push_str("\n[cut: the instructions passed their size limit here]");
            }
        }
    }
    let found = skills_in(anchor, &dirs, limits.max_skills);
    let (skills, mut left_out) = (found.skills, found.left_out);
    let mut listed = Vec::new();
    if !skills.is_empty() {
        prompt.push_str(
            "\n\n# Skills\n\nLoad a skill with the `skill` tool when the task calls for it; \
             its instructions then follow.\n",
        );
        for skill in skills {
            let line = format!("\n- {}: {}", skill.name, skill.description);
            if line.len() > left {
                left_out = true;
                break;
            }
            left -= line.len();
            prompt.push_str(&line);
            listed.push(skill);
        }
    }
    if left_out {
        prompt.push_str("\n[cut: more skills are there than the instructions' limits list]");
    }
    Gathered {
        prompt: prompt.into(),
        sources,
        skills: listed,
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

/// The start of the file at `rel`, at most `limit` bytes of it; `None` when it is not there
/// or cannot be read (a symlink, a directory).
fn read(anchor: &Path, rel: &Path, limit: u64) -> Option<fs_safe::Prefix> {
    match fs_safe::read_prefix_no_follow(anchor, rel, limit) {
        Ok(prefix) => Some(prefix),
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

/// The skills found for a session's list, and whether the count limit left some out.
struct SkillScan {
    /// At most `max_skills`, by name.
    skills: Vec<Skill>,
    /// Whether more were there (or more were left unread).
    left_out: bool,
}

/// The skills under the skill directories of `dirs`, by name, a nearer directory's winning.
///
/// At most four times `max_skills` skill files are read in all, each only as far as its front
/// matter can go, so a repository of a million skills costs what a few hundred cost.
fn skills_in(anchor: &Path, dirs: &[PathBuf], max_skills: usize) -> SkillScan {
    let mut found: std::collections::BTreeMap<String, Skill> = Default::default();
    let mut reads_left = max_skills.saturating_mul(4);
    let mut left_out = false;
    for dir in dirs {
        for skills_dir in SKILL_DIRS {
            let skills_dir = dir.join(skills_dir);
            let Ok(entries) = fs_safe::list_dir_at_most_no_follow(
                anchor,
                &skills_dir,
                reads_left.saturating_add(1),
            ) else {
                continue;
            };
            for entry in entries {
                if entry.kind != fs_safe::EntryKind::Dir {
                    continue;
                }
                if reads_left == 0 {
                    left_out = true;
                    break;
                }
                reads_left -= 1;
                let skill_dir = skills_dir.join(&entry.name);
                let Some(file) = read(
                    anchor,
                    &skill_dir.join("SKILL.md"),
                    MAX_SKILL_FRONT_MATTER_BYTES,
                ) else {
                    continue;
                };
                let text = String::from_utf8_lossy(&file.bytes);
                let parsed = split_front_matter(&text)
                    .and_then(|(front, _)| serde_norway::from_str::<FrontMatter>(front).ok())
                    .filter(|front| {
                        !front.name.is_empty() && front.name.len() <= MAX_SKILL_NAME_BYTES
                    });
                let Some(front) = parsed else {
                    tracing::warn!(path = %skill_dir.display(), "SKILL.md without a name (of at most {MAX_SKILL_NAME_BYTES} bytes) and a description in its first {MAX_SKILL_FRONT_MATTER_BYTES} bytes; skipped");
                    continue;
                };
                let description = front.description.split_whitespace().collect::<Vec<_>>();
                let description = description.join(" ");
                found.insert(
                    front.name.clone(),
                    Skill {
                        name: front.name,
                        description: cut_at(&description, MAX_SKILL_DESCRIPTION_BYTES).to_string(),
                        dir: skill_dir,
                    },
                );
            }
        }
    }
    if found.len() > max_skills {
        left_out = true;
    }
    SkillScan {
        skills: found.into_values().take(max_skills).collect(),
        left_out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_bytes: usize) -> InstructionLimits {
        InstructionLimits {
            max_bytes,
            max_skills: 100,
        }
    }

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
                limits("Root rules.\n".len() + "App rules.\n".len() + 4),
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
            limits(1000),
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
        let gathered = gather(
            "B",
            None,
            limits(1000),
            anchor,
            Path::new("u"),
            Path::new("u/p"),
        );
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

    #[test]
    fn a_tebibyte_agents_file_is_read_only_as_far_as_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("u")).unwrap();
        let file = std::fs::File::create(dir.path().join("u/AGENTS.md")).unwrap();
        file.set_len(1 << 40).unwrap();
        let gathered = gather(
            "B",
            None,
            limits(100),
            dir.path(),
            Path::new("u"),
            Path::new("u"),
        );
        assert_eq!(
            gathered.sources,
            [InstructionSource {
                path: "AGENTS.md".into(),
                bytes: 1 << 40,
                cut: true,
            }]
        );
        assert!(gathered.prompt.len() < 300, "{}", gathered.prompt.len());
    }

    #[test]
    fn skills_are_bounded_in_count_description_and_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let anchor = dir.path();
        let description = "word ".repeat(1000);
        for n in 0..300 {
            write(
                anchor,
                &format!("u/.agents/skills/s{n:03}/SKILL.md"),
                &format!("---\nname: s{n:03}\ndescription: {description}\n---\nbody\n"),
            );
        }
        write(
            anchor,
            "u/.agents/skills/long-name/SKILL.md",
            &format!("---\nname: {}\ndescription: d\n---\n", "n".repeat(65)),
        );
        let roomy = InstructionLimits {
            max_bytes: 1 << 20,
            max_skills: 100,
        };
        let gathered = gather("B", None, roomy, anchor, Path::new("u"), Path::new("u"));
        assert_eq!(gathered.skills.len(), 100);
        assert!(gathered.skills.iter().all(|skill| skill.description.len()
            <= MAX_SKILL_DESCRIPTION_BYTES
            && skill.name.len() <= MAX_SKILL_NAME_BYTES));
        assert!(gathered.prompt.contains("[cut: more skills"));
        // A small budget lists fewer, and the prompt stays within it.
        let gathered = gather(
            "B",
            None,
            limits(8 * 1024),
            anchor,
            Path::new("u"),
            Path::new("u"),
        );
        assert!(!gathered.skills.is_empty() && gathered.skills.len() < 8);
        assert!(
            gathered.prompt.len() < 8 * 1024 + 300,
            "{}",
            gathered.prompt.len()
        );
        assert!(gathered.prompt.contains("[cut: more skills"));
    }
}
