//! Integration test modules.

mod agent;
mod cli;
mod llm;
mod server;
mod sub_agents;
mod tasks;
mod tool_core;
