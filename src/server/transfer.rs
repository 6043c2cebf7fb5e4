//! `agentd export` and `agentd import`: a session carried out of or into the configured store
//! from the command line, through the same hub calls as the REST routes.

use super::Server;
use crate::session::Caller;

impl Server {
    /// The session `session_id` of `user` as JSON Lines (see `session::transfer`), with its
    /// checkpoints when `with_checkpoints`.
    pub async fn export_session(
        &self,
        user: Option<String>,
        session_id: &str,
        with_checkpoints: bool,
    ) -> Result<String, String> {
        self.state
            .sessions()
            .export(&Caller { user }, session_id, with_checkpoints)
            .await
            .map_err(|err| err.to_string())
    }

    /// A new session of `user`'s from an export's JSON Lines; answers its id and a newline.
    pub async fn import_session(&self, user: Option<String>, body: &str) -> Result<String, String> {
        let imported = crate::session::transfer::parse(body).map_err(|err| err.to_string())?;
        let row = self
            .state
            .sessions()
            .import(&Caller { user }, imported)
            .await
            .map_err(|err| err.to_string())?;
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
