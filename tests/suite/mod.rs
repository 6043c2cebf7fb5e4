//! Integration test modules.

mod agent;
mod browser;
mod cli;
mod limits;
mod llm;
mod server;
mod sub_agents;
mod tasks;
mod tool_core;
