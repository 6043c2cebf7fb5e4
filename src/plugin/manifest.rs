//! A plugin's manifest: the `[[plugins]]` entry validated into the immutable definition every
//! workspace binding of the plugin shares.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::tools::args::ArgsValidator;
use crate::tools::{Effects, ToolMeta};

/// `[[plugins]]`: an external program offered as a tool, as the configuration gives it.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PluginConfig {
    /// The tool name.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The program to run.
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Whether calls run in the background.
    #[serde(default)]
    pub spawn_only: bool,
    /// Capability tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Whether it must run alone.
    #[serde(default = "default_true")]
    pub exclusive: bool,
    /// Kill it after this many milliseconds.
    #[serde(default = "default_plugin_timeout")]
    pub timeout_ms: u64,
    /// JSON Schema of its arguments.
    #[serde(default = "default_plugin_schema")]
    pub input_schema: Value,
}

pub(crate) fn default_true() -> bool {
    true
}

pub(crate) fn default_plugin_timeout() -> u64 {
    600_000
}

pub(crate) fn default_plugin_schema() -> Value {
    serde_json::json!({"type": "object"})
}

/// Longest tool name a plugin may have.
pub const MAX_NAME_LEN: usize = 64;

/// Why a `[[plugins]]` entry cannot become a tool; the message names the plugin and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    /// The name is empty, too long or has characters outside `[a-z0-9_-]`.
    #[error(
        "plugin {name:?}: invalid name: {why} (use 1 to {MAX_NAME_LEN} characters from a-z, 0-9, `_` and `-`)"
    )]
    InvalidName {
        /// The name as configured.
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// `description` is blank; the model would not know when to call it.
    #[error("plugin {name}: `description` is empty; say what the plugin does for the model")]
    EmptyDescription {
        /// The plugin's name.
        name: String,
    },
    /// `command` is blank.
    #[error("plugin {name}: `command` is empty; give the program to run")]
    EmptyCommand {
        /// The plugin's name.
        name: String,
    },
    /// `timeout_ms` is 0.
    #[error("plugin {name}: `timeout_ms` must be greater than 0")]
    InvalidTimeout {
        /// The plugin's name.
        name: String,
    },
    /// A tag is blank.
    #[error("plugin {name}: tag {index} is empty")]
    EmptyTag {
        /// The plugin's name.
        name: String,
        /// Its position in `tags`.
        index: usize,
    },
    /// `input_schema` is not a valid JSON Schema for an object.
    #[error("plugin {name}: invalid `input_schema`: {message}")]
    InvalidSchema {
        /// The plugin's name.
        name: String,
        /// What is wrong with the schema.
        message: String,
    },
}

/// The validated, immutable part of a plugin, shared by every workspace binding of it.
#[derive(Debug)]
pub(super) struct Definition {
    /// Name, description, schema, tags and concurrency, as the registry reads them.
    pub(super) meta: ToolMeta,
    /// The program, as configured.
    pub(super) command: String,
    /// Command-line arguments; the call's own arguments go to stdin.
    pub(super) args: Vec<String>,
    /// Whether calls run in the background.
    pub(super) spawn_only: bool,
    /// How long one call may run.
    pub(super) timeout: Duration,
}

impl Definition {
    /// Validates one `[[plugins]]` entry; the error names the plugin and the field at fault.
    pub(super) fn from_config(config: &PluginConfig) -> Result<Self, PluginError> {
        let name = config.name.clone();
        check_name(&name)?;
        if config.description.trim().is_empty() {
            return Err(PluginError::EmptyDescription { name });
        }
        if config.command.trim().is_empty() {
            return Err(PluginError::EmptyCommand { name });
        }
        if config.timeout_ms == 0 {
            return Err(PluginError::InvalidTimeout { name });
        }
        if let Some(index) = config.tags.iter().position(|t| t.trim().is_empty()) {
            return Err(PluginError::EmptyTag { name, index });
        }
        check_schema(&name, &config.input_schema)?;
        // A plugin is a program: nothing in its manifest can vouch for what it does, so it
        // counts as running a command, with everything a command can do.
        let mut meta = ToolMeta::new(
            name,
            &config.description,
            config.input_schema.clone(),
            Effects::RUNS_COMMANDS,
        );
        meta.tags = config.tags.iter().map(|t| intern(t)).collect();
        if config.exclusive {
            meta = meta.exclusive();
        }
        Ok(Definition {
            meta,
            command: config.command.clone(),
            args: config.args.clone(),
            spawn_only: config.spawn_only,
            timeout: Duration::from_millis(config.timeout_ms),
        })
    }
}

/// One shared copy of each distinct tag text, alive for the whole process.
///
/// [`ToolMeta::tags`] holds `&'static str`s, so the strings must outlive any one tool value.
/// Leaking each distinct tag text once (and only once, however many times plugins are built or
/// rebound) keeps that sound at a cost bounded by the configured tags; the per-plugin list
/// itself lives in the [`Definition`] shared by rebinds and is freed with it.
fn intern(tag: &str) -> &'static str {
    static TAGS: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut tags = crate::mutex::lock(TAGS.get_or_init(Mutex::default));
    if let Some(known) = tags.get(tag) {
        return known;
    }
    let leaked: &'static str = Box::leak(tag.to_owned().into_boxed_str());
    tags.insert(leaked);
    leaked
}

/// Refuses a name the model could not call reliably.
fn check_name(name: &str) -> Result<(), PluginError> {
    let invalid = |why: String| PluginError::InvalidName {
        name: name.to_owned(),
        why,
    };
    if name.is_empty() {
        return Err(invalid("it is empty".into()));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(invalid(format!("it is {} characters long", name.len())));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '_' | '-'))
    {
        return Err(invalid(format!("{bad:?} is not allowed")));
    }
    Ok(())
}

/// Refuses a schema that is not a valid JSON Schema for one object of arguments.
fn check_schema(name: &str, schema: &Value) -> Result<(), PluginError> {
    let invalid = |message: String| PluginError::InvalidSchema {
        name: name.to_owned(),
        message,
    };
    let Some(object) = schema.as_object() else {
        return Err(invalid(format!("expected a JSON object, found {schema}")));
    };
    if object.get("type") != Some(&json!("object")) {
        return Err(invalid(
            "it must declare \"type\": \"object\" (a call's arguments are one JSON object)".into(),
        ));
    }
    ArgsValidator::compile(schema).map_err(|err| invalid(err.message))?;
    Ok(())
}
