//! Integration test modules.

mod cli;
mod server;
mod tool_core;
