//! agentd: a server that hosts LLM agent sessions for a browser app.
//!
//! - [`config`]: the one typed configuration (defaults, TOML file, environment, flags).
//! - [`tools`]: the tool system — the `Tool` trait, the per-session registry with its policy,
//!   LRU and argument checks, and symlink-safe file access.

pub mod config;
pub mod tools;
