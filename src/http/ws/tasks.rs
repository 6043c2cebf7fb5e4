//! The `task/*` methods: a session's tasks, a task's output, and cancelling one.

use serde_json::{Value, json};

use super::Connection;
use super::request::TaskParams;
use super::rpc::RpcError;
use crate::error_kind::ErrorKind;
use crate::http::AppState;
use crate::session::{Caller, SessionError};
use crate::store::TaskRow;
use crate::tasks::read::{TaskReadError, read_task_output, task_of_session, with_live_size};

impl Connection {
    /// `task/list`: the session's tasks, with the live output size of running ones.
    pub(super) async fn task_list(&mut self, session_id: &str) -> Result<Value, RpcError> {
        self.app.sessions().row(&self.caller, session_id).await?;
        let tasks = self
            .app
            .sessions()
            .store()
            .list_tasks(session_id)
            .await
            .map_err(SessionError::from)?;
        let tasks: Vec<TaskRow> = tasks.into_iter().map(with_live_size).collect();
        Ok(json!({ "tasks": tasks }))
    }

    /// The session's task named in `params` (`unknown_task` for any other).
    async fn session_task(&mut self, params: &TaskParams) -> Result<TaskRow, RpcError> {
        self.app
            .sessions()
            .row(&self.caller, &params.session_id)
            .await?;
        task_of_session(
            self.app.sessions().store(),
            &params.task_id,
            &params.session_id,
        )
        .await
        .map_err(task_error)
    }

    /// `task/output/read`: the part of the task's output the query asks for.
    pub(super) async fn read_output(&mut self, params: &TaskParams) -> Result<Value, RpcError> {
        let task = self.session_task(params).await?;
        let query = params.output.to_query().map_err(RpcError::params)?;
        read_task_output(&task, query).await.map_err(task_error)
    }
}

/// `task/cancel`: stops the session's task and answers its final state.
pub(super) async fn cancel_task(
    app: &AppState,
    caller: &Caller,
    params: &TaskParams,
) -> Result<Value, RpcError> {
    let sessions = app.sessions();
    sessions.row(caller, &params.session_id).await?;
    let task = task_of_session(sessions.store(), &params.task_id, &params.session_id)
        .await
        .map_err(task_error)?;
    if task.state == crate::store::TaskState::Running {
        let handle = sessions.handle(caller, &params.session_id).await?;
        if let Some(state) = handle.cancel_task(params.task_id.clone()).await? {
            return Ok(json!({"task_id": params.task_id, "state": state}));
        }
    }
    // Not running in this server: what the store says now is the answer.
    let task = task_of_session(sessions.store(), &params.task_id, &params.session_id)
        .await
        .map_err(task_error)?;
    Ok(json!({"task_id": params.task_id, "state": task.state}))
}

fn task_error(err: TaskReadError) -> RpcError {
    match err {
        TaskReadError::UnknownTask(id) => SessionError::UnknownTask(id).into(),
        TaskReadError::Store(err) => SessionError::Store(err).into(),
        TaskReadError::Unreadable(message) => RpcError::new(ErrorKind::Internal, message),
    }
}
