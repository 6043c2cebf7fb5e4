//! Plugin tools: an external program from one `[[plugins]]` entry offered as a tool.
//!
//! A call runs the program directly (no shell) in the workspace root, with the secret-free
//! child environment, in a process group of its own. The call's arguments arrive on stdin as
//! one JSON document followed by EOF; stdout is the result text; stderr is streamed line by
//! line to the session as task output and its tail is kept for the failure message; a
//! non-zero exit makes the result unsuccessful. A timeout or cancellation kills the whole
//! process group, and so does the program's exit: nothing a plugin starts outlives its call.
//!
//! - `manifest`: the `[[plugins]]` entry validated into a shared definition.
//! - `process`: one call's process: spawn, stdin, the read loop, kill and report.
//! - `output`: the stdout cap and the stderr tail and live stream.

mod manifest;
mod output;
mod process;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use self::manifest::Definition;
use crate::tools::{Tool, ToolContext, ToolError, ToolMeta, ToolResult, Workspace};
pub use manifest::PluginConfig;

pub use self::manifest::{MAX_NAME_LEN, PluginError};
pub use self::output::{STDERR_TAIL_BYTES, STDOUT_CAP_BYTES};

/// A tool that runs the external program of one `[[plugins]]` entry in its workspace.
#[derive(Debug, Clone)]
pub struct PluginTool {
    def: Arc<Definition>,
    workspace: Arc<Workspace>,
}

impl PluginTool {
    /// Validates one `[[plugins]]` entry and binds it to `workspace`, where its program runs.
    pub fn new(config: &PluginConfig, workspace: Arc<Workspace>) -> Result<Self, PluginError> {
        Ok(Self {
            def: Arc::new(Definition::from_config(config)?),
            workspace,
        })
    }

    /// Whether the config asks for calls to run in the background; the host marks the tool
    /// spawn-only in the registry when this is true.
    pub fn spawn_only(&self) -> bool {
        self.def.spawn_only
    }
}

#[async_trait]
impl Tool for PluginTool {
    fn meta(&self) -> &ToolMeta {
        &self.def.meta
    }

    async fn call(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        self.run(ctx, args).await
    }

    fn rebind_cwd(&self, workspace: &Arc<Workspace>) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(Self {
            def: Arc::clone(&self.def),
            workspace: Arc::clone(workspace),
        }))
    }
}
