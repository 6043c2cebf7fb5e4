//! The session's own MCP servers (`scope = "server"` ones live in the base registry): started
//! in the background as the actor begins, in the session's sandbox and directory; their tools
//! join the registry once each is up, and their processes end with the actor.

use std::sync::Arc;

use super::SessionActor;
use crate::tools::mcp::{McpServer, McpState};

impl SessionActor {
    /// Starts every pending server in a task of its own; each reports back when it is up or
    /// has failed, so a slow server holds up nothing.
    pub(super) fn start_mcp_servers(&mut self) {
        let Some(workspace) = self.registry.workspace().cloned() else {
            for config in std::mem::take(&mut self.mcp_pending) {
                let state = McpState::Failed("the session has no workspace".into());
                self.mcp_states.set(&config.name, &state);
            }
            return;
        };
        for config in std::mem::take(&mut self.mcp_pending) {
            self.mcp_states.set(&config.name, &McpState::Starting);
            let started = self.mcp_started.sender();
            let workspace = Arc::clone(&workspace);
            self.tracker.spawn(async move {
                let server = McpServer::start(config, &workspace).await;
                // A session that stopped meanwhile drops it, which ends its process.
                let _ = started.send(server).await;
            });
        }
    }

    /// A server of the session is up (its tools join the registry) or has failed.
    pub(super) async fn on_mcp_started(&mut self, server: Arc<McpServer>) {
        let state = server.state();
        if state == McpState::Ready {
            let before = self.registry.catalog();
            for tool in server.tools() {
                let name = tool.name().to_string();
                if let Err(err) = self.registry.register(tool) {
                    tracing::warn!(%err, tool = %name, "MCP tool not registered");
                }
            }
            if server.defers() {
                self.registry
                    .defer_group(&format!("group:mcp:{}", server.name()));
            }
            self.announce_tool_changes(before).await;
        }
        // Said last: whoever reads `ready` finds the tools registered.
        self.mcp_states.set(server.name(), &state);
        self.mcp_servers.push(server);
    }
}
