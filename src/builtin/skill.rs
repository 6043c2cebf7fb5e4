//! skill: loads one of the skills a session's instructions list (a `SKILL.md` under
//! `.agents/skills/<name>/` or `.claude/skills/<name>/` between the user's workspace root and
//! the session's cwd): its instructions, and the other files of its directory.

use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::parse_args;
use crate::fs_safe;
use crate::tools::workspace::Workspace;
use crate::tools::{Effects, Tool, ToolContext, ToolError, ToolMeta, ToolResult};

/// The largest `SKILL.md` read.
pub const MAX_SKILL_BYTES: u64 = 256 * 1024;
/// Most files of a skill's directory listed.
const MAX_LISTED_FILES: usize = 100;

/// A skill: a `SKILL.md` whose front matter names and describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skill {
    /// Its name, as `skill {name}` takes it.
    pub name: String,
    /// When to use it, as the model is told.
    pub description: String,
    /// Its directory, relative to the anchor of the session's root.
    #[serde(skip)]
    pub dir: PathBuf,
}

/// The skills a session's `skill` tool serves, shared through its workspace.
#[derive(Debug, Default)]
pub struct SkillIndex {
    skills: std::sync::Mutex<Vec<Skill>>,
}

impl crate::tools::workspace::SharedState for SkillIndex {}

impl SkillIndex {
    /// Replaces the list (each turn's gathering does).
    pub fn set(&self, skills: Vec<Skill>) {
        *crate::mutex::lock(&self.skills) = skills;
    }

    /// The skill named `name`.
    pub fn find(&self, name: &str) -> Option<Skill> {
        crate::mutex::lock(&self.skills)
            .iter()
            .find(|skill| skill.name == name)
            .cloned()
    }

    /// Every skill's name.
    pub fn names(&self) -> Vec<String> {
        crate::mutex::lock(&self.skills)
            .iter()
            .map(|skill| skill.name.clone())
            .collect()
    }
}

/// Splits a `SKILL.md` into its front matter and its body.
pub fn split_front_matter(text: &str) -> Option<(&str, &str)> {
    let rest = text.strip_prefix("---")?;
    let rest = rest
        .strip_prefix("\r\n")
        .or_else(|| rest.strip_prefix('\n'))?;
    let end = rest.find("\n---")?;
    let body = &rest[end + 4..];
    let body = body.split_once('\n').map_or("", |(_, body)| body);
    Some((&rest[..end], body))
}

/// Loads a skill's instructions by name.
pub struct SkillTool {
    workspace: Arc<Workspace>,
}

impl SkillTool {
    /// A skill tool bound to `workspace`.
    pub fn new(workspace: Arc<Workspace>) -> Self {
        Self { workspace }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SkillArgs {
    name: String,
}

#[async_trait]
impl Tool for SkillTool {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "skill",
                "Load a skill listed under Skills in your instructions: answers its full \
                 instructions and the other files of its directory (to read with read_file). \
                 Load one when the task calls for it, before starting that work.",
                json!({
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "description": "The skill's name, as listed."}
                    },
                    "required": ["name"],
                    "additionalProperties": false
                }),
                Effects::NONE,
            )
            .tags(&["meta"])
        });
        &META
    }

    async fn call(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        let args: SkillArgs = parse_args(&self.meta().name, args)?;
        let index = self.workspace.shared::<SkillIndex>();
        let Some(skill) = index.find(&args.name) else {
            let names = index.names();
            return Err(ToolError::model(
                "invalid_input",
                if names.is_empty() {
                    format!("no skill {:?}: this session has no skills", args.name)
                } else {
                    format!(
                        "no skill {:?}; the skills are {}",
                        args.name,
                        names.join(", ")
                    )
                },
            ));
        };
        let root = self.workspace.root_path();
        let bytes =
            fs_safe::read_no_follow(root.anchor(), &skill.dir.join("SKILL.md"), MAX_SKILL_BYTES)?;
        let text = String::from_utf8_lossy(&bytes);
        let body = split_front_matter(&text).map_or(&*text, |(_, body)| body);
        let mut out = format!("# Skill: {}\n\n{}", skill.name, body.trim_end());
        let files = files_of(root.anchor(), &skill.dir);
        if !files.is_empty() {
            out.push_str("\n\n## Files of this skill\n");
            for file in files {
                match file.strip_prefix(root.below()) {
                    Ok(inside) => out.push_str(&format!("\n- {}", inside.display())),
                    Err(_) => out.push_str(&format!(
                        "\n- {} (above the session's directory: read_file cannot reach it)",
                        file.display()
                    )),
                }
            }
        }
        Ok(ToolResult::ok(out))
    }

    fn rebind_cwd(&self, workspace: &Arc<Workspace>) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(Self::new(Arc::clone(workspace))))
    }
}

/// The files of a skill's directory besides `SKILL.md`, two levels deep, sorted.
fn files_of(anchor: &Path, dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![(dir.to_path_buf(), 0)];
    while let Some((at, depth)) = dirs.pop() {
        let Ok(entries) = fs_safe::list_dir_no_follow(anchor, &at) else {
            continue;
        };
        for entry in entries {
            let path = at.join(&entry.name);
            match entry.kind {
                fs_safe::EntryKind::File if path != dir.join("SKILL.md") => files.push(path),
                fs_safe::EntryKind::Dir if depth < 1 => dirs.push((path, depth + 1)),
                _ => {}
            }
        }
    }
    files.sort();
    files.truncate(MAX_LISTED_FILES);
    files
}
