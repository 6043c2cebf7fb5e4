//! agentd: a server that hosts LLM agent sessions for a browser app.
//!
//! - [`config`]: the one typed configuration (defaults, TOML file, environment, flags).
//! - [`tools`]: the tool system — the `Tool` trait, the per-session registry with its policy,
//!   LRU and argument checks, and symlink-safe file access.
//! - [`store`]: persistence — the `Store` trait over SQLite or PostgreSQL (sqlx), its rows and
//!   migrations.

pub mod config;
pub mod store;
pub mod tools;
