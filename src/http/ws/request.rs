//! The requests a client can send: one enum variant per JSON-RPC method, each with its own
//! params type, read straight from the envelope's `method` and `params`.

use crate::llm::ImageData;
use crate::session::{ImageInput, MAX_INPUT_IMAGES};
use serde::Deserialize;
use serde_json::{Value, json};

use super::rpc::RpcError;
use crate::tasks::output::OutputParams;

/// One request, by method.
///
/// Read from `{"method": .., "params": ..}` with the tag first, so serde reads the params
/// straight from their [`Value`] (nothing is buffered): a params error reads exactly as
/// `serde_json::from_value` into the params type would have it.
#[derive(Deserialize)]
#[serde(tag = "method", content = "params")]
pub(super) enum Request {
    /// `session/open`.
    #[serde(rename = "session/open")]
    SessionOpen(OpenParams),
    /// `session/fork`.
    #[serde(rename = "session/fork")]
    SessionFork(ForkParams),
    /// `session/compact`.
    #[serde(rename = "session/compact")]
    SessionCompact(SessionParams),
    /// `session/update`.
    #[serde(rename = "session/update")]
    SessionUpdate(UpdateParams),
    /// `session/revert`.
    #[serde(rename = "session/revert")]
    SessionRevert(RevertParams),
    /// `session/merge`: the session's worktree merged back.
    #[serde(rename = "session/merge")]
    SessionMerge(MergeParams),
    /// `session/discard`: the session's worktree thrown away.
    #[serde(rename = "session/discard")]
    SessionDiscard(SessionParams),
    /// `tool/invoke`.
    #[serde(rename = "tool/invoke")]
    ToolInvoke(InvokeParams),
    /// `tool/list`.
    #[serde(rename = "tool/list")]
    ToolList(SessionParams),
    /// `turn/start`.
    #[serde(rename = "turn/start")]
    TurnStart(TurnParams),
    /// `turn/interrupt`.
    #[serde(rename = "turn/interrupt")]
    TurnInterrupt(SessionParams),
    /// `turn/steer`.
    #[serde(rename = "turn/steer")]
    TurnSteer(SteerParams),
    /// `user_input/respond`.
    #[serde(rename = "user_input/respond")]
    UserInputRespond(RespondParams),
    /// `approval/respond`.
    #[serde(rename = "approval/respond")]
    ApprovalRespond(ApprovalParams),
    /// `task/list`.
    #[serde(rename = "task/list")]
    TaskList(SessionParams),
    /// `task/output/read`.
    #[serde(rename = "task/output/read")]
    TaskOutputRead(TaskParams),
    /// `task/cancel`.
    #[serde(rename = "task/cancel")]
    TaskCancel(TaskParams),
    /// `model/list`.
    #[serde(rename = "model/list")]
    ModelList(IgnoredParams),
    /// `agent/list` (extension): the agent profiles.
    #[serde(rename = "agent/list")]
    AgentList(IgnoredParams),
    /// Any other method. Its params are skipped unread, so an unknown method is answered as
    /// unknown whatever its params hold.
    #[serde(other, deserialize_with = "skip_params")]
    Unknown,
}

impl Request {
    /// The request `method` names; missing or `null` params read as `{}`.
    pub(super) fn read(method: &str, params: Value) -> Result<Self, RpcError> {
        let params = if params.is_null() { json!({}) } else { params };
        // Both of serde_json's map orders (sorted, or as inserted) put "method" first.
        serde_json::from_value(json!({"method": method, "params": params}))
            .map_err(RpcError::params)
    }

    /// The method's name; `None` for one the server does not have.
    pub(super) fn method(&self) -> Option<&'static str> {
        Some(match self {
            Self::SessionOpen(_) => "session/open",
            Self::SessionFork(_) => "session/fork",
            Self::SessionCompact(_) => "session/compact",
            Self::SessionUpdate(_) => "session/update",
            Self::SessionRevert(_) => "session/revert",
            Self::SessionMerge(_) => "session/merge",
            Self::SessionDiscard(_) => "session/discard",
            Self::ToolInvoke(_) => "tool/invoke",
            Self::ToolList(_) => "tool/list",
            Self::TurnStart(_) => "turn/start",
            Self::TurnInterrupt(_) => "turn/interrupt",
            Self::TurnSteer(_) => "turn/steer",
            Self::UserInputRespond(_) => "user_input/respond",
            Self::ApprovalRespond(_) => "approval/respond",
            Self::TaskList(_) => "task/list",
            Self::TaskOutputRead(_) => "task/output/read",
            Self::TaskCancel(_) => "task/cancel",
            Self::ModelList(_) => "model/list",
            Self::AgentList(_) => "agent/list",
            Self::Unknown => return None,
        })
    }
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

/// `session/revert`: the turn whose start the workspace goes back to.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RevertParams {
    pub session_id: String,
    pub turn_id: String,
    #[serde(default)]
    pub dry_run: bool,
    #[serde(default)]
    pub force: bool,
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

/// `tool/invoke`: one tool call outside a turn.
#[derive(Deserialize)]
pub(super) struct InvokeParams {
    pub session_id: String,
    pub name: String,
    #[serde(default)]
    pub arguments: Value,
    /// Runs the call without asking for approval: for the console, where the person who would
    /// decide is the one calling.
    #[serde(default)]
    pub skip_approval: bool,
}

/// `approval/respond`: the decision about a call waiting for approval.
#[derive(Deserialize)]
pub(super) struct ApprovalParams {
    pub session_id: String,
    pub approval_id: String,
    pub decision: crate::agent::approval::Decision,
    pub message: Option<String>,
}

/// `turn/start`.
#[derive(Deserialize)]
pub(super) struct TurnParams {
    pub session_id: String,
    input: Vec<InputItem>,
    pub turn_id: Option<String>,
    /// The model for this turn only.
    pub model: Option<String>,
    /// The reasoning effort for this turn only.
    pub reasoning_effort: Option<String>,
    /// `_meta`: the caller's trace context.
    #[serde(rename = "_meta", default)]
    pub meta: Option<TurnMeta>,
}

/// `turn/start`'s `_meta`.
#[derive(Deserialize, Default)]
pub(super) struct TurnMeta {
    /// A W3C trace context the turn's `invoke_agent` span continues.
    pub traceparent: Option<String>,
}

impl TurnParams {
    /// The model choice it carries.
    pub(super) fn choice(&self) -> crate::session::ModelChoice {
        crate::session::ModelChoice {
            model: self.model.clone(),
            reasoning_effort: self.reasoning_effort.clone(),
        }
    }

    /// The input's text items, one per line, and its images; refused when it has neither
    /// or an image is unusable.
    pub(super) fn input(&self) -> Result<(String, Vec<ImageInput>), RpcError> {
        turn_input(&self.input)
    }
}

/// `turn/start`'s `input` read from JSON, for a caller other than the WebSocket (REST turns);
/// the error is the message `turn/start` would give.
pub(crate) fn read_turn_input(input: Value) -> Result<(String, Vec<ImageInput>), RpcError> {
    let items: Vec<InputItem> =
        serde_json::from_value(input).map_err(|err| RpcError::params(format!("input: {err}")))?;
    turn_input(&items)
}

/// The text items, one per line, and the images of a turn's input; refused when it has
/// neither or an image is unusable.
fn turn_input(input: &[InputItem]) -> Result<(String, Vec<ImageInput>), RpcError> {
    let mut images = Vec::new();
    let mut text = Vec::new();
    for item in input {
        match item {
            InputItem::Text { text: line } => text.push(line.as_str()),
            InputItem::Image { mime, data, path } => images.push(image_input(
                images.len(),
                mime.as_deref(),
                data.as_deref(),
                path.as_deref(),
            )?),
        }
    }
    if text.is_empty() && images.is_empty() {
        return Err(RpcError::params(
            "input needs at least one {kind: \"text\", text} or {kind: \"image\"} item",
        ));
    }
    if images.len() > MAX_INPUT_IMAGES {
        return Err(RpcError::params(format!(
            "input has {} images; at most {MAX_INPUT_IMAGES} are taken",
            images.len()
        )));
    }
    Ok((text.join("\n"), images))
}

/// One image item, checked: `{mime, data}` inline or `{path}` in the workspace, not both.
fn image_input(
    index: usize,
    mime: Option<&str>,
    data: Option<&str>,
    path: Option<&str>,
) -> Result<ImageInput, RpcError> {
    let refuse = |problem: String| RpcError::params(format!("input image {index}: {problem}"));
    match (mime, data, path) {
        (Some(mime), Some(data), None) => ImageData::from_base64(mime, data)
            .map(ImageInput::Inline)
            .map_err(|err| refuse(err.to_string())),
        (None, None, Some(path)) if !path.is_empty() => Ok(ImageInput::Path {
            path: path.to_string(),
        }),
        _ => Err(refuse(
            "give either {mime, data} (base64) or {path} (relative to the workspace)".into(),
        )),
    }
}

/// `turn/steer`: more input for the running turn `turn_id`.
#[derive(Deserialize)]
pub(super) struct SteerParams {
    pub session_id: String,
    pub turn_id: String,
    input: Vec<InputItem>,
}

impl SteerParams {
    /// The input's text items, one per line; refused when there are none.
    pub(super) fn text(&self) -> Result<String, RpcError> {
        input_text(&self.input)
    }
}

/// Text items, one per line; refused when there are none or there is an image (steering
/// takes text only).
fn input_text(input: &[InputItem]) -> Result<String, RpcError> {
    let mut text = Vec::new();
    for item in input {
        match item {
            InputItem::Text { text: line } => text.push(line.as_str()),
            InputItem::Image { .. } => {
                return Err(RpcError::params(
                    "turn/steer takes text items only; send images with turn/start",
                ));
            }
        }
    }
    if text.is_empty() {
        return Err(RpcError::params(
            "input needs at least one {kind: \"text\", text} item",
        ));
    }
    Ok(text.join("\n"))
}

#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum InputItem {
    Text {
        text: String,
    },
    Image {
        mime: Option<String>,
        data: Option<String>,
        path: Option<String>,
    },
}

/// `user_input/respond`: the answers to a pending user-input request.
#[derive(Deserialize)]
pub(super) struct RespondParams {
    pub session_id: String,
    pub request_id: String,
    pub answers: Value,
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
