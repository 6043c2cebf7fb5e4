//! agentd: a server that hosts LLM agent sessions for a browser app.
//!
//! - [`server`]: start-up and shutdown; [`run`] serves a config on a listener until told to stop.
//! - [`agent`]: the turn loop — model calls, tool batches, LRU ticks, cost rows.
//! - [`config`]: the one typed configuration (defaults, TOML file, environment, flags).
//! - [`tools`]: the tool system — the `Tool` trait, the per-session registry with its policy,
//!   LRU and argument checks.
//! - [`builtin`]: the tools every registry offers, each family in its file.
//! - [`plugin`]: external programs from `[[plugins]]` offered as tools.
//! - [`mcp`]: the tools of `[[mcp_servers]]` (Model Context Protocol servers).
//! - [`data_dir`]: the one process's exclusive hold on its data directory.
//! - [`checkpoint`]: a session's workspace snapshots, for `turn/diff` and `session/revert`.
//! - [`fs_safe`]: symlink-safe, root-confined file I/O.
//! - [`capped_read`]: reads that stop one byte past a cap, for everything a user, a model or
//!   a peer controls.
//! - [`disk_quota`]: each user's disk quota and the free space kept for the server.
//! - [`secret`]: strings (keys, tokens) that never show in logs.
//! - [`error_kind`]: the one vocabulary of refusals, with each kind's HTTP status, JSON-RPC code
//!   and MCP class.
//! - [`tasks`]: background task output — the per-task log spool and `read_task_output`'s modes.
//! - [`session`]: session actors, their handles, and the directory that loads and unloads them.
//! - [`http`]: the accept loop with its connection limits, and the router — WebSocket
//!   JSON-RPC, REST, health, metrics, auth.
//! - [`llm`]: the model provider (OpenAI-compatible chat completions) and pricing.
//! - [`metrics`]: the Prometheus metrics of one server.
//! - [`heap`]: giving memory freed by closed sessions and connections back to the system.
//! - [`sandbox`]: the confinement of every process a session starts, and its launcher.
//! - [`store`]: persistence — the `Store` trait over SQLite or PostgreSQL (sqlx), its rows and
//!   migrations.

// Tests read files they made and answers they asked for whole; the product does not.
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod agent;
pub mod builtin;
pub mod capped_read;
pub mod checkpoint;
pub mod cluster;
pub mod config;
pub mod data_dir;
pub mod disk_quota;
pub mod error_kind;
pub mod fs_safe;
pub mod heap;
pub mod http;
pub mod llm;
pub mod mcp;
pub mod metrics;
pub mod mutex;
pub mod plugin;
pub mod sandbox;
pub mod secret;
pub mod server;
pub mod session;
pub mod store;
pub mod tasks;
pub mod telemetry;
pub mod tools;

pub use server::{Server, StartupError, run};
