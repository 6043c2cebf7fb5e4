//! Integration test modules.

mod agent;
mod cli;
mod llm;
mod server;
mod tool_core;
