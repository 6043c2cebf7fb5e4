//! tool_search, tool_suggest and activate_tools: finding and loading tools the model cannot see
//! yet, from the registry's live catalog.

use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::parse_args;
use crate::tools::catalog::{CatalogEntry, ToolCatalog, ToolState};
use crate::tools::registry::DeferralToolFactory;
use crate::tools::{Effects, Tool, ToolContext, ToolError, ToolMeta, ToolResult};

/// Words too common to say anything about which tool fits.
const STOP_WORDS: &[&str] = &[
    "a", "an", "and", "the", "to", "of", "in", "on", "for", "with", "by", "from", "at", "is", "it",
    "this", "that", "i", "me", "my", "we", "you", "some", "all", "any", "into", "or", "be", "can",
    "want", "need", "please", "how", "do", "use", "tool", "tools",
];

/// How well one catalog entry fits a query.
struct Ranked<'a> {
    entry: &'a CatalogEntry,
    score: u32,
}

/// Lower-case words of a query, without stop words.
fn words(query: &str) -> Vec<String> {
    query
        .split(|c: char| !c.is_alphanumeric() && c != '_')
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .filter(|w| !STOP_WORDS.contains(&w.as_str()))
        .collect()
}

/// Scores visible and deferred tools against `query`: name matches weigh most, then tags and
/// group, then the description. Hidden tools are never offered.
fn rank<'a>(catalog: &'a ToolCatalog, query: &str) -> Vec<Ranked<'a>> {
    let words = words(query);
    let mut ranked: Vec<Ranked<'a>> = catalog
        .entries
        .iter()
        .filter(|entry| matches!(entry.state, ToolState::Active | ToolState::Deferred))
        .map(|entry| {
            let name = entry.name().to_lowercase();
            let description = entry.description().to_lowercase();
            let score = words
                .iter()
                .map(|word| {
                    let mut score = 0;
                    if name == *word {
                        score += 10;
                    } else if name.split('_').any(|part| part == word) {
                        score += 6;
                    } else if name.contains(word.as_str()) {
                        score += 4;
                    }
                    if entry.tags().iter().any(|tag| tag == word) || entry.group() == Some(word) {
                        score += 3;
                    }
                    if description.contains(word.as_str()) {
                        score += 1;
                    }
                    score
                })
                .sum();
            Ranked { entry, score }
        })
        .filter(|r| r.score > 0)
        .collect();
    ranked.sort_by(|a, b| {
        b.score
            .cmp(&a.score)
            .then(a.entry.name().cmp(b.entry.name()))
    });
    ranked
}

/// The first sentence of a description, for one-line listings.
fn summary(description: &str) -> &str {
    match description.find(". ") {
        Some(end) => &description[..=end],
        None => description,
    }
}

fn state_word(state: ToolState) -> &'static str {
    match state {
        ToolState::Active => "active",
        ToolState::Deferred => "deferred",
        ToolState::Hidden(_) => "hidden",
    }
}

/// Renders ranked tools as text and metadata.
fn listing(ranked: &[Ranked<'_>], heading: &str) -> ToolResult {
    let mut text = format!("{heading}\n");
    for r in ranked {
        let group = r
            .entry
            .group()
            .map(|g| format!(" (group:{g})"))
            .unwrap_or_default();
        text.push_str(&format!(
            "- {} [{}]{group}: {}\n",
            r.entry.name(),
            state_word(r.entry.state),
            summary(r.entry.description())
        ));
    }
    if ranked.iter().any(|r| r.entry.state == ToolState::Deferred) {
        text.push_str(
            "Deferred tools can be called directly (they load on first use) or loaded with activate_tools.\n",
        );
    }
    let tools: Vec<Value> = ranked
        .iter()
        .map(|r| json!({"name": r.entry.name(), "state": state_word(r.entry.state), "score": r.score}))
        .collect();
    ToolResult::ok(text).with_metadata(json!({ "tools": tools }))
}

fn catalog_of(ctx: &ToolContext, tool: &str) -> Result<Arc<ToolCatalog>, ToolError> {
    ctx.catalog.as_ref().map(|cell| cell.load()).ok_or_else(|| {
        ToolError::model(
            "unavailable",
            format!("{tool} needs the session's tool catalog, which this call was not given"),
        )
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    query: String,
    limit: Option<usize>,
}

/// Searches the live catalog by name, description and tags.
#[derive(Debug, Default)]
pub struct ToolSearch;

#[async_trait]
impl Tool for ToolSearch {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "tool_search",
                "Search every tool this session can use, including deferred ones you cannot see \
                 yet, by name, description and tags. Returns matching tools with their state.",
                json!({
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "description": "Words describing the tool you need, or part of its name."},
                        "limit": {"type": "integer", "minimum": 1, "maximum": 50, "description": "Most results to return. Default 10."}
                    },
                    "required": ["query"],
                    "additionalProperties": false
                }),
Effects::NONE,
            )
            .base()
            .contract()
            .tags(&["meta"])
        });
        &META
    }

    async fn call(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        let args: SearchArgs = parse_args(&self.meta().name, args)?;
        let catalog = catalog_of(ctx, &self.meta().name)?;
        let mut ranked = rank(&catalog, &args.query);
        if ranked.is_empty() {
            return Ok(ToolResult::ok(format!(
                "no tool matches {:?}; try other words",
                args.query
            ))
            .with_metadata(json!({"tools": []})));
        }
        ranked.truncate(args.limit.unwrap_or(10).clamp(1, 50));
        Ok(listing(
            &ranked,
            &format!("tools matching {:?}:", args.query),
        ))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SuggestArgs {
    task: String,
}

/// Suggests the tools that fit a task described in plain words.
#[derive(Debug, Default)]
pub struct ToolSuggest;

#[async_trait]
impl Tool for ToolSuggest {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "tool_suggest",
                "Describe what you are trying to do and get the five tools that fit it best, \
                 including deferred ones, with how to load them.",
                json!({
                    "type": "object",
                    "properties": {
                        "task": {"type": "string", "description": "What you want to do, in a sentence."}
                    },
                    "required": ["task"],
                    "additionalProperties": false
                }),
Effects::NONE,
            )
            .contract()
            .tags(&["meta"])
        });
        &META
    }

    async fn call(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        let args: SuggestArgs = parse_args(&self.meta().name, args)?;
        let catalog = catalog_of(ctx, &self.meta().name)?;
        let mut ranked = rank(&catalog, &args.task);
        if ranked.is_empty() {
            return Ok(ToolResult::ok(
                "no tool fits that task; tool_search with other words may find one",
            )
            .with_metadata(json!({"tools": []})));
        }
        ranked.truncate(5);
        Ok(listing(&ranked, "suggested tools, best first:"))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ActivateArgs {
    #[serde(default)]
    tools: Vec<String>,
    group: Option<String>,
}

/// Loads deferred tools so the model sees them from its next step on; registered by the
/// registry only while something is deferred, with a description naming what is.
pub struct ActivateTools {
    meta: ToolMeta,
}

impl ActivateTools {
    /// An activate_tools whose description lists `deferred`.
    pub fn new(deferred: &[&str]) -> Self {
        let description = format!(
            "Load deferred tools so you can see and call them from your next step on. \
             Deferred now: {}. You may also call a deferred tool directly; it loads on \
             first use.",
            deferred.join(", ")
        );
        let schema = json!({
            "type": "object",
            "properties": {
                "tools": {"type": "array", "items": {"type": "string"}, "description": "Names of deferred tools to load."},
                "group": {"type": "string", "description": "A group to load whole: fs, search, runtime, web or sessions (with or without the group: prefix)."}
            },
            "additionalProperties": false
        });
        Self {
            meta: ToolMeta::new("activate_tools", description, schema, Effects::NONE)
                .base()
                .contract()
                .tags(&["meta"])
                .exclusive(),
        }
    }

    /// The factory the registry uses to keep this tool in step with the deferred set.
    pub fn factory() -> DeferralToolFactory {
        Arc::new(|deferred: &[&str]| Arc::new(ActivateTools::new(deferred)) as Arc<dyn Tool>)
    }
}

#[async_trait]
impl Tool for ActivateTools {
    fn meta(&self) -> &ToolMeta {
        &self.meta
    }

    async fn call(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        let args: ActivateArgs = parse_args(&self.meta().name, args)?;
        let Some(cell) = ctx.catalog.as_ref() else {
            return Err(ToolError::model(
                "unavailable",
                "activate_tools needs the session's registry, which this call was not given",
            ));
        };
        let catalog = cell.load();
        let mut wanted: Vec<String> = args.tools;
        if let Some(group) = &args.group {
            let bare = group.strip_prefix("group:").unwrap_or(group);
            let members: Vec<String> = catalog
                .entries
                .iter()
                .filter(|e| e.tool.meta().groups.contains(&bare))
                .map(|e| e.name().to_string())
                .collect();
            if members.is_empty() {
                return Err(ToolError::model(
                    "invalid_input",
                    format!(
                        "no tools in group {group:?}; groups are fs, search, runtime, web, sessions"
                    ),
                ));
            }
            wanted.extend(members);
        }
        if wanted.is_empty() {
            return Err(ToolError::model(
                "invalid_input",
                "name the tools to load, or a group",
            ));
        }
        let (mut loading, mut already, mut unavailable) = (Vec::new(), Vec::new(), Vec::new());
        for name in wanted {
            match catalog.get(&name).map(|e| e.state) {
                Some(ToolState::Deferred) => loading.push(name),
                Some(ToolState::Active) => already.push(name),
                _ => unavailable.push(name),
            }
        }
        loading.sort();
        loading.dedup();
        cell.request_activation(loading.iter().cloned());
        let mut text = String::new();
        if !loading.is_empty() {
            text.push_str(&format!("loaded: {}\n", loading.join(", ")));
        }
        if !already.is_empty() {
            text.push_str(&format!("already available: {}\n", already.join(", ")));
        }
        if !unavailable.is_empty() {
            text.push_str(&format!(
                "not available in this session: {}\n",
                unavailable.join(", ")
            ));
        }
        let result =
            json!({"activated": loading, "already_active": already, "unavailable": unavailable});
        if loading.is_empty() && already.is_empty() {
            return Ok(ToolResult::failure(text).with_metadata(result));
        }
        Ok(ToolResult::ok(text).with_metadata(result))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{ToolRegistry, Workspace};

    fn registry() -> ToolRegistry {
        let mut registry = ToolRegistry::default();
        let ws = Workspace::new(".");
        for tool in [
            Arc::new(super::super::files::ReadFile::new(Arc::clone(&ws))) as Arc<dyn Tool>,
            Arc::new(super::super::files::WriteFile::new(Arc::clone(&ws))),
            Arc::new(super::super::plan::UpdatePlan),
            Arc::new(ToolSearch),
            Arc::new(ToolSuggest),
        ] {
            registry.register(tool).unwrap();
        }
        registry.set_deferral_tool("activate_tools", ActivateTools::factory());
        registry
    }

    fn ctx(registry: &ToolRegistry) -> ToolContext {
        ToolContext {
            catalog: Some(registry.catalog_cell()),
            ..ToolContext::detached(".")
        }
    }

    #[tokio::test]
    async fn tool_search_ranks_names_first_and_marks_deferred_tools() {
        let mut registry = registry();
        registry.defer_group("group:fs");
        let result = ToolSearch
            .call(&ctx(&registry), &json!({"query": "write a file"}))
            .await
            .unwrap();
        let names: Vec<&str> = result.structured_metadata.as_ref().unwrap()["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(names[0], "write_file", "{}", result.output);
        assert!(
            result.output.contains("write_file [deferred] (group:fs)"),
            "{}",
            result.output
        );
        assert!(result.output.contains("activate_tools"));

        let none = ToolSearch
            .call(&ctx(&registry), &json!({"query": "teleport"}))
            .await
            .unwrap();
        assert!(none.output.starts_with("no tool matches"));
    }

    #[tokio::test]
    async fn tool_suggest_reads_the_live_catalog() {
        let mut registry = registry();
        let cell_ctx = ctx(&registry);
        let before = ToolSuggest
            .call(&cell_ctx, &json!({"task": "I need to plan my steps"}))
            .await
            .unwrap();
        assert!(
            before.output.contains("update_plan [active]"),
            "{}",
            before.output
        );
        registry.unregister("update_plan");
        let after = ToolSuggest
            .call(&cell_ctx, &json!({"task": "I need to plan my steps"}))
            .await
            .unwrap();
        assert!(!after.output.contains("update_plan"), "{}", after.output);
        let detached = ToolSuggest
            .call(&ToolContext::detached("."), &json!({"task": "x"}))
            .await
            .unwrap_err();
        assert!(matches!(
            detached,
            ToolError::Model {
                kind: "unavailable",
                ..
            }
        ));
    }

    #[tokio::test]
    async fn activate_tools_appears_while_something_is_deferred_and_loads_it() {
        let mut registry = registry();
        assert!(!registry.contains("activate_tools"));
        registry.defer_group("group:fs");
        let description = registry
            .get("activate_tools")
            .unwrap()
            .description()
            .to_string();
        assert!(
            description.contains("Deferred now: read_file, write_file."),
            "{description}"
        );

        let args = json!({"tools": ["read_file", "update_plan", "nope"]});
        let result = registry
            .execute_with_context(&ctx(&registry), "activate_tools", &args)
            .await
            .unwrap();
        assert!(result.success);
        assert_eq!(
            result.structured_metadata.unwrap(),
            json!({"activated": ["read_file"], "already_active": ["update_plan"], "unavailable": ["nope"]})
        );
        registry.tick();
        assert_eq!(registry.deferred_names(), ["write_file"]);
        let description = registry
            .get("activate_tools")
            .unwrap()
            .description()
            .to_string();
        assert!(
            description.contains("Deferred now: write_file."),
            "{description}"
        );

        let by_group = registry
            .execute_with_context(
                &ctx(&registry),
                "activate_tools",
                &json!({"group": "group:fs"}),
            )
            .await
            .unwrap();
        assert!(
            by_group.output.contains("loaded: write_file"),
            "{}",
            by_group.output
        );
        registry.tick();
        assert!(registry.deferred_names().is_empty());
        assert!(
            !registry.contains("activate_tools"),
            "gone once nothing is deferred"
        );
    }
}
