//! Integration test modules.

mod cli;
mod llm;
mod server;
mod tool_core;
