//! The requests a client can send: a session's method, read straight into its
//! [`SessionRequest`], or one the connection carries out itself (opening, forking, tasks,
//! catalogs), each with its own params type, read from the envelope's `method` and `params`.

use crate::session::SessionRequest;
use serde::Deserialize;
use serde_json::{Value, json};

use super::rpc::RpcError;
use crate::tasks::output::OutputParams;

/// One request, by method.
pub(super) enum Request {
    /// A method the connection carries out itself.
    Connection(ConnectionRequest),
    /// A session's method, for its actor.
    Session {
        /// The session its params' `session_id` names.
        session_id: String,
        /// The request, read from the rest of the params.
        request: SessionRequest,
    },
    /// A method the server does not have.
    Unknown,
}

/// A method the connection carries out itself, not a session's actor.
///
/// Read from `{"method": .., "params": ..}` with the tag first, so serde reads the params
/// straight from their [`Value`] (nothing is buffered): a params error reads exactly as
/// `serde_json::from_value` into the params type would have it.
#[derive(Deserialize)]
#[serde(tag = "method", content = "params")]
pub(super) enum ConnectionRequest {
    /// `session/open`.
    #[serde(rename = "session/open")]
    SessionOpen(OpenParams),
    /// `session/fork`.
    #[serde(rename = "session/fork")]
    SessionFork(ForkParams),
    /// `session/update`.
    #[serde(rename = "session/update")]
    SessionUpdate(UpdateParams),
    /// `session/merge`: the session's worktree merged back.
    #[serde(rename = "session/merge")]
    SessionMerge(MergeParams),
    /// `session/discard`: the session's worktree thrown away.
    #[serde(rename = "session/discard")]
    SessionDiscard(SessionParams),
    /// `task/list`.
    #[serde(rename = "task/list")]
    TaskList(SessionParams),
    /// `task/output/read`.
    #[serde(rename = "task/output/read")]
    TaskOutputRead(TaskParams),
    /// `task/cancel`: also for a task no actor runs.
    #[serde(rename = "task/cancel")]
    TaskCancel(TaskParams),
    /// `model/list`.
    #[serde(rename = "model/list")]
    ModelList(IgnoredParams),
    /// `agent/list` (extension): the agent profiles.
    #[serde(rename = "agent/list")]
    AgentList(IgnoredParams),
    /// Any other method: perhaps a session's. Its params are skipped unread.
    #[serde(other, deserialize_with = "skip_params")]
    Other,
}

impl Request {
    /// The request `method` names; missing or `null` params read as `{}`.
    pub(super) fn read(method: &str, params: Value) -> Result<Self, RpcError> {
        let params = if params.is_null() { json!({}) } else { params };
        // Both of serde_json's map orders (sorted, or as inserted) put "method" first.
        let envelope = json!({"method": method, "params": params});
        match ConnectionRequest::deserialize(&envelope).map_err(RpcError::params)? {
            ConnectionRequest::Other => Self::read_session(method, envelope),
            own => Ok(Self::Connection(own)),
        }
    }

    /// A session's method: `session_id` taken out of the envelope's params, the rest read as
    /// its [`SessionRequest`].
    fn read_session(method: &str, mut envelope: Value) -> Result<Self, RpcError> {
        let session_id = match addressed(&mut envelope["params"]) {
            Ok(session_id) => session_id,
            Err(_) if !SessionRequest::is_client_method(method) => return Ok(Self::Unknown),
            Err(err) => return Err(err),
        };
        match SessionRequest::from_client(envelope) {
            Ok(Some(request)) => Ok(Self::Session {
                session_id,
                request,
            }),
            Ok(None) => Ok(Self::Unknown),
            Err(err) => Err(RpcError::params(err)),
        }
    }

    /// The method's name; `None` for one the server does not have.
    pub(super) fn method(&self) -> Option<&'static str> {
        Some(match self {
            Self::Session { request, .. } => request.method(),
            Self::Connection(own) => match own {
                ConnectionRequest::SessionOpen(_) => "session/open",
                ConnectionRequest::SessionFork(_) => "session/fork",
                ConnectionRequest::SessionUpdate(_) => "session/update",
                ConnectionRequest::SessionMerge(_) => "session/merge",
                ConnectionRequest::SessionDiscard(_) => "session/discard",
                ConnectionRequest::TaskList(_) => "task/list",
                ConnectionRequest::TaskOutputRead(_) => "task/output/read",
                ConnectionRequest::TaskCancel(_) => "task/cancel",
                ConnectionRequest::ModelList(_) => "model/list",
                ConnectionRequest::AgentList(_) => "agent/list",
                ConnectionRequest::Other => return None,
            },
            Self::Unknown => return None,
        })
    }
}

/// Takes a session method's `session_id` out of its params; the error is the one reading
/// `{session_id}` gives.
fn addressed(params: &mut Value) -> Result<String, RpcError> {
    let by_position =
        || RpcError::params("a session method takes its params by name, in an object");
    if params.is_array() {
        return Err(by_position());
    }
    let SessionParams { session_id } =
        SessionParams::deserialize(&*params).map_err(RpcError::params)?;
    let Value::Object(rest) = params else {
        return Err(by_position());
    };
    rest.remove("session_id");
    Ok(session_id)
}

fn skip_params<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<(), D::Error> {
    serde::de::IgnoredAny::deserialize(deserializer).map(|_| ())
}

/// `session/open`: a session to re-attach (or none, to create one) and where to replay from.
#[derive(Deserialize)]
pub(super) struct OpenParams {
    pub session_id: Option<String>,
    pub cwd: Option<String>,
    pub after_seq: Option<i64>,
    /// The model the session uses from now on (`<provider>/<model>`).
    pub model: Option<String>,
    /// The reasoning effort its turns ask for.
    pub reasoning_effort: Option<String>,
    /// The agent profile (`[[agents]]`) a new session is opened as.
    pub agent: Option<String>,
    /// Where a new session works: `worktree` for a git worktree of its own.
    pub isolation: Option<crate::session::worktree::Isolation>,
    /// The commit the worktree's branch starts from (with `isolation: "worktree"`).
    pub base: Option<String>,
}

impl OpenParams {
    /// The model choice it carries.
    pub(super) fn choice(&self) -> crate::session::ModelChoice {
        crate::session::ModelChoice {
            model: self.model.clone(),
            reasoning_effort: self.reasoning_effort.clone(),
        }
    }
}

/// Params a method does not read (`model/list {}`).
#[derive(Deserialize)]
pub(super) struct IgnoredParams {}

/// `session/fork`: the session to fork, up to which event, and where the fork works.
#[derive(Deserialize)]
pub(super) struct ForkParams {
    pub session_id: String,
    pub up_to_seq: Option<i64>,
    pub cwd: Option<String>,
}

/// `session/update`: what to change of a session (its title).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct UpdateParams {
    pub session_id: String,
    pub title: String,
}

/// `session/merge`: the session whose worktree is merged, and the message for what it left
/// uncommitted.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MergeParams {
    pub session_id: String,
    pub message: Option<String>,
}

/// Methods that name only a session.
#[derive(Deserialize)]
pub(super) struct SessionParams {
    pub session_id: String,
}

/// `task/output/read` and `task/cancel`: one of the session's tasks.
#[derive(Deserialize)]
pub(super) struct TaskParams {
    pub session_id: String,
    pub task_id: String,
    /// Only `task/output/read` reads it.
    #[serde(flatten)]
    pub output: OutputParams,
}

#[cfg(test)]
mod tests;
