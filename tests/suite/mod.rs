//! Integration test modules.

mod agent;
mod browser;
mod cli;
mod limits;
mod llm;
mod sandbox;
mod server;
mod sub_agents;
mod tasks;
mod tool_core;
