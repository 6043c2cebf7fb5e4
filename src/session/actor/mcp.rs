//! The session's own MCP servers (`scope = "server"` ones live in the base registry): started
//! in the background as the actor begins, in the session's sandbox and directory; their tools
//! join the registry once each is up, and their processes end with the actor. The session
//! follows every server's tool list, its own and the shared ones: when a server lists its
//! tools again (`notifications/tools/list_changed`, or a restart), the registry follows and
//! `tools/changed` tells the clients.

use std::collections::HashSet;
use std::sync::Arc;

use super::SessionActor;
use super::link::ActorRequest;
use crate::mcp::{McpServer, McpServerConfig, McpState, tool_name};
use crate::session::SessionMcp;

/// The session's MCP servers: its own, not yet started and then running (their processes end
/// when the actor drops them), the server-wide ones whose tool lists it follows, and where
/// their states are told to the session's handles.
pub(super) struct McpPart {
    pub(super) pending: Vec<McpServerConfig>,
    pub(super) running: Vec<Arc<McpServer>>,
    pub(super) states: Arc<SessionMcp>,
    pub(super) shared: Vec<Arc<McpServer>>,
}

impl SessionActor {
    /// Starts every pending server in a task of its own; each reports back when it is up or
    /// has failed, so a slow server holds up nothing. The shared servers' tools are brought up
    /// to date (the base registry holds their first list) and followed from here on.
    pub(super) fn start_mcp_servers(&mut self) {
        for server in self.mcp.shared.clone() {
            if server.state() == McpState::Ready {
                self.sync_mcp_tools(&server);
            }
            self.follow_mcp_listings(&server);
        }
        let Some(workspace) = self.registry.workspace().cloned() else {
            for config in std::mem::take(&mut self.mcp.pending) {
                let state = McpState::Failed("the session has no workspace".into());
                self.mcp.states.set(&config.name, &state);
            }
            return;
        };
        for config in std::mem::take(&mut self.mcp.pending) {
            self.mcp.states.set(&config.name, &McpState::Starting);
            let started = self.inbound.sender();
            let workspace = Arc::clone(&workspace);
            self.tracker.spawn(async move {
                let server = McpServer::start(config, &workspace).await;
                // A session that stopped meanwhile drops it, which ends its process.
                let _ = started.send(ActorRequest::McpStarted(server)).await;
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
        self.follow_mcp_listings(&server);
        // Said last: whoever reads `ready` finds the tools registered.
        self.mcp.states.set(server.name(), &state);
        self.mcp.running.push(server);
    }
}

impl SessionActor {
    /// Hands `server`'s every new tool listing to the actor, for as long as both live.
    fn follow_mcp_listings(&mut self, server: &Arc<McpServer>) {
        let mut listings = server.listings();
        listings.mark_unchanged();
        let server = Arc::downgrade(server);
        let relisted = self.inbound.sender();
        let stopped = self.cancel.clone();
        self.tracker.spawn(async move {
            loop {
                tokio::select! {
                    () = stopped.cancelled() => return,
                    changed = listings.changed() => if changed.is_err() {
                        return;
                    },
                }
                let Some(server) = server.upgrade() else {
                    return;
                };
                if relisted
                    .send(ActorRequest::McpRelisted(server))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
    }

    /// A server listed its tools again: the registry follows, and clients hear of it.
    pub(super) async fn on_mcp_relisted(&mut self, server: Arc<McpServer>) {
        let before = self.registry.catalog();
        self.sync_mcp_tools(&server);
        self.announce_tool_changes(before).await;
    }

    /// Makes the registry's tools of `server` its current list: new tools join (deferred when
    /// the server defers), gone ones leave, changed ones are replaced. A kept tool keeps its
    /// place: active, deferred or hidden.
    fn sync_mcp_tools(&mut self, server: &McpServer) {
        let prefix = tool_name(server.name(), "");
        let current = server.tools();
        let listed: HashSet<&str> = current.iter().map(|tool| tool.name()).collect();
        let gone: Vec<String> = self
            .registry
            .catalog()
            .entries
            .iter()
            .map(|entry| entry.name())
            .filter(|name| name.starts_with(&prefix) && !listed.contains(name))
            .map(str::to_string)
            .collect();
        for name in gone {
            self.registry.unregister(&name);
        }
        for tool in current {
            let name = tool.name().to_string();
            let known = self.registry.get(&name).map(|known| {
                known.description() == tool.description()
                    && known.input_schema() == tool.input_schema()
            });
            if known == Some(true) {
                continue;
            }
            if let Err(err) = self.registry.register(tool) {
                tracing::warn!(%err, tool = %name, "MCP tool not registered");
                continue;
            }
            if known.is_none() && server.defers() {
                self.registry.defer_tool(&name);
            }
        }
    }
}
