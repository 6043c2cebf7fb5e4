//! `agentd export` and `agentd import`: a session carried out of or into the configured store
//! from the command line, through the same hub calls as the REST routes.

use super::Server;
use crate::session::transfer::ExportFormatError;
use crate::session::{Caller, SessionError};

/// Why a session could not be carried out of or into the store.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// The hub refused (no such session, a quota, the store).
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The text to import is not an export.
    #[error(transparent)]
    Format(#[from] ExportFormatError),
}

impl Server {
    /// The session `session_id` of `user` as JSON Lines (see `session::transfer`), with its
    /// checkpoints when `with_checkpoints`.
    pub async fn export_session(
        &self,
        user: Option<String>,
        session_id: &str,
        with_checkpoints: bool,
    ) -> Result<String, TransferError> {
        Ok(self
            .state
            .sessions()
            .export(&Caller { user }, session_id, with_checkpoints)
            .await?)
    }

    /// A new session of `user`'s from an export's JSON Lines, read a line at a time; answers
    /// its id and a newline.
    pub async fn import_session(
        &self,
        user: Option<String>,
        body: impl tokio::io::AsyncBufRead + Unpin,
    ) -> Result<String, TransferError> {
        let imported = crate::session::transfer::read(body).await?;
        let row = self
            .state
            .sessions()
            .import(&Caller { user }, imported)
            .await?;
        Ok(format!("{}\n", row.session_id))
    }

    /// Stops what the server started (sessions, tasks) and closes the store, for the
    /// commands that run it in-process and exit.
    pub async fn stop(self) {
        self.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
        self.store.close().await;
    }
}
