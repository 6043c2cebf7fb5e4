//! Tools from Model Context Protocol servers: `[[mcp_servers]]` entries, each server's tools
//! offered in the registry as `mcp__<server>__<tool>` (groups `group:mcp` and
//! `group:mcp:<server>`), so policy, tags, deferral and the LRU apply to them like to any tool.
//!
//! - [`result`]: an MCP `tools/call` result as a [`ToolResult`](super::ToolResult).
//! - [`client`]: the connection to one server (stdio in the sandbox, or streamable HTTP) and its tools.
//!
//! Stdio servers with `scope = "server"` start once, at start-up, shared by every session; with
//! `scope = "session"` each session's actor starts its own as it loads, in the session's sandbox
//! and directory, ending with it. `url` servers are reached over streamable HTTP.

pub mod client;
pub mod result;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use client::{McpServer, McpState};

use crate::sandbox::Sandbox;
use crate::sandbox::command_env::CommandEnv;
use crate::tools::Workspace;

/// Prefix of every MCP tool's registry name.
pub const TOOL_PREFIX: &str = crate::tools::policy::MCP_TOOL_PREFIX;

/// Where one server's process lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// One process per session, working in the session's directory.
    Session,
    /// One process for the whole server, shared by every session.
    Server,
}

/// `[[mcp_servers]]`: one MCP server whose tools become registry tools.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// `[a-z0-9_-]+`, unique; the middle of its tools' names.
    pub name: String,
    /// The program of a stdio server.
    #[serde(default)]
    pub command: Option<String>,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// The only variables that reach it, beside a minimal PATH, HOME and LANG.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The endpoint of a streamable-HTTP server, instead of `command`.
    #[serde(default)]
    pub url: Option<String>,
    /// The environment variable whose value is sent as the bearer token to `url`.
    #[serde(default)]
    pub bearer_token_env: Option<String>,
    /// One process per session (the default) or one for the server.
    #[serde(default = "default_scope")]
    pub scope: Scope,
    /// How long the server may take to start and list its tools.
    #[serde(default = "default_startup_timeout")]
    pub startup_timeout_secs: u64,
    /// How long one call may take.
    #[serde(default = "default_tool_timeout")]
    pub tool_timeout_secs: u64,
    /// Whether its tools start deferred, loaded on demand.
    #[serde(default = "default_true")]
    pub defer: bool,
    /// Whether the server's own process may use the network inside the sandbox.
    #[serde(default)]
    pub network: bool,
}

fn default_scope() -> Scope {
    Scope::Session
}

fn default_startup_timeout() -> u64 {
    20
}

fn default_tool_timeout() -> u64 {
    120
}

fn default_true() -> bool {
    true
}

impl McpServerConfig {
    /// Why the entry cannot be used, naming the server and the field.
    pub fn problem(&self) -> Option<String> {
        let name = &self.name;
        let valid_name = !name.is_empty()
            && name.len() <= 32
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if !valid_name {
            return Some(format!(
                "mcp_servers: name `{name}` must be 1 to 32 characters of [a-z0-9_-]"
            ));
        }
        if name.contains("__") {
            return Some(format!(
                "mcp_servers.{name}: a name may not contain `__`, which separates it from its tools' names"
            ));
        }
        match (&self.command, &self.url) {
            (Some(_), Some(_)) => {
                return Some(format!(
                    "mcp_servers.{name}: give `command` (stdio) or `url` (HTTP), not both"
                ));
            }
            (None, None) => {
                return Some(format!(
                    "mcp_servers.{name}: give `command` (stdio) or `url` (HTTP)"
                ));
            }
            (Some(command), None) if command.trim().is_empty() => {
                return Some(format!("mcp_servers.{name}: `command` is empty"));
            }
            _ => {}
        }
        if self.url.is_none() && self.bearer_token_env.is_some() {
            return Some(format!(
                "mcp_servers.{name}: `bearer_token_env` applies to `url` servers only"
            ));
        }
        if self.startup_timeout_secs == 0 || self.tool_timeout_secs == 0 {
            return Some(format!(
                "mcp_servers.{name}: startup_timeout_secs and tool_timeout_secs must be at least 1"
            ));
        }
        None
    }
}

/// Starts every `scope = "server"` server, each in a sandboxed directory of its own under
/// `<data_dir>/mcp/<name>` (so a shared server reaches no user's workspace); a server that does
/// not come up is reported in its state, never fatal. A server gets `command_env`, as every
/// command does, plus its own `env`.
pub async fn start_servers(
    configs: &[McpServerConfig],
    data_dir: &Path,
    sandbox: Option<&Arc<Sandbox>>,
    command_env: &Arc<CommandEnv>,
) -> Vec<Arc<McpServer>> {
    let mut servers = Vec::with_capacity(configs.len());
    for config in configs
        .iter()
        .filter(|config| config.scope == Scope::Server)
    {
        let dir = data_dir.join("mcp").join(&config.name);
        if let Err(err) = std::fs::create_dir_all(&dir) {
            tracing::warn!(server = %config.name, %err, "MCP server directory not created");
        }
        let dir = std::path::absolute(&dir).unwrap_or(dir);
        let confined =
            sandbox.map(|sandbox| sandbox.for_session(&format!("mcp-{}", config.name), &dir));
        let workspace = Workspace::anchored(&dir, ".", confined, Arc::clone(command_env));
        servers.push(McpServer::start(config.clone(), &workspace).await);
    }
    servers
}

/// The registry name of `tool` of server `server`.
pub fn tool_name(server: &str, tool: &str) -> String {
    format!("{TOOL_PREFIX}{server}__{tool}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(toml_text: &str) -> McpServerConfig {
        toml::from_str(toml_text).expect("parses")
    }

    #[test]
    fn the_contract_example_parses_with_its_defaults() {
        let server = entry(
            r#"
            name = "everything"
            command = "npx"
            args = ["-y", "@modelcontextprotocol/server-everything"]
            env = {}
            "#,
        );
        assert_eq!(server.scope, Scope::Session);
        assert_eq!(server.startup_timeout_secs, 20);
        assert_eq!(server.tool_timeout_secs, 120);
        assert!(server.defer);
        assert!(!server.network);
        assert_eq!(server.problem(), None);
    }

    #[test]
    fn bad_entries_are_named_with_their_field() {
        let bad = [
            (
                r#"name = "Bad Name"
                command = "x""#,
                "name `Bad Name`",
            ),
            (
                r#"name = "a__b"
                command = "x""#,
                "`__`",
            ),
            (r#"name = "a""#, "give `command`"),
            (
                r#"name = "a"
                command = "x"
                url = "http://h/mcp""#,
                "not both",
            ),
            (
                r#"name = "a"
                command = "x"
                bearer_token_env = "T""#,
                "`url` servers only",
            ),
            (
                r#"name = "a"
                command = "x"
                tool_timeout_secs = 0"#,
                "at least 1",
            ),
        ];
        for (text, expected) in bad {
            let problem = entry(text).problem().expect("refused");
            assert!(problem.contains(expected), "{problem}");
        }
        assert!(
            toml::from_str::<McpServerConfig>("name = \"a\"\ncommand = \"x\"\nnope = 1").is_err()
        );
    }

    #[test]
    fn mcp_groups_name_tools_by_server() {
        let tool = tool_name("everything", "echo");
        assert_eq!(tool, "mcp__everything__echo");
        assert_eq!(
            crate::tools::policy::mcp_group_names("group:mcp:everything", &tool),
            Some(true)
        );
    }
}
