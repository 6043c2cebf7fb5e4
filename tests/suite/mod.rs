//! Integration test modules.

mod server;
mod tool_core;
