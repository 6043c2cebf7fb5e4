//! agentd: a server that hosts LLM agent sessions for a browser app.
//!
//! - [`tools`]: the tool system — the `Tool` trait, the per-session registry with its policy,
//!   LRU and argument checks, and symlink-safe file access.

pub mod tools;
