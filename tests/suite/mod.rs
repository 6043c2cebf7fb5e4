//! Integration test modules.

mod agent;
mod anthropic;
mod architecture;
mod browser;
mod checkpoints;
mod cli;
mod cluster;
mod first_hour;
mod hooks;
mod human;
mod instructions;
mod limits;
mod litellm;
mod llm;
mod long_sessions;
mod mcp;
mod mcp_server;
mod models;
mod responses;
mod sandbox;
mod server;
mod storage;
mod sub_agents;
mod tasks;
mod tool_core;
mod transfer;
