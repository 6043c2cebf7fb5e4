//! Integration test modules.

mod tool_core;
