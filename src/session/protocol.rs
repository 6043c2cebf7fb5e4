//! The one typed protocol of a session: what any caller asks of it ([`SessionRequest`]) and
//! what it answers ([`SessionReply`]). The WebSocket, REST, ACP, `agentd exec` and a cluster
//! follower all send these to the actor through [`super::SessionHandle::request`]; between
//! nodes they travel as they are, serialised. A new session method is a variant here, its arm
//! in the actor's `handle_request`, and its docs.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{
    ImageInput, InvokeOptions, InvokeResult, MAX_INPUT_IMAGES, ModelChoice, SessionError,
    SessionView,
};
use crate::agent::approval::Decision;
use crate::agent::compaction::CompactionStats;
use crate::llm::ImageData;
use crate::store::TaskState;

/// One request to a session, in the wire form of its JSON-RPC method: `{"method", "params"}`
/// with the method's params by name, less the `session_id` that addresses it (see
/// [`SessionRequest::from_client`]). The WebSocket reads a client's params straight into it and
/// a cluster follower forwards it to the owner as it is; the few variants and fields a client
/// does not send are marked so.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "method", content = "params")]
pub enum SessionRequest {
    /// What `session/open` reports (not a client's: `session/open` does more).
    #[serde(rename = "node/describe")]
    Describe {},
    /// `tool/invoke`.
    #[serde(rename = "tool/invoke")]
    InvokeTool {
        /// The tool.
        name: String,
        /// Its arguments.
        #[serde(default)]
        arguments: Value,
        /// Runs the call without asking for approval: for the console, where the person who
        /// would decide is the one calling.
        #[serde(default)]
        skip_approval: bool,
        /// The caller's call id (not a client's: the actor names a client's calls).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool_call_id: Option<String>,
        /// Cancels it when run here (a token does not travel between nodes).
        #[serde(skip)]
        cancel: Option<tokio_util::sync::CancellationToken>,
    },
    /// `tool/list`.
    #[serde(rename = "tool/list")]
    ToolList {},
    /// `turn/start`.
    #[serde(rename = "turn/start")]
    StartTurn {
        /// The input: its text and images.
        input: TurnInput,
        /// The caller's turn id.
        #[serde(default)]
        turn_id: Option<String>,
        /// The model the turn chose.
        #[serde(default)]
        model: Option<String>,
        /// The reasoning effort the turn chose.
        #[serde(default)]
        reasoning_effort: Option<String>,
        /// `_meta`: the caller's trace context.
        #[serde(rename = "_meta", default, skip_serializing_if = "TurnMeta::is_empty")]
        meta: TurnMeta,
    },
    /// `session/open` with a model: the actor takes the stored choice (not a client's).
    #[serde(rename = "node/set_model")]
    SetModel {
        /// The model.
        model: Option<String>,
        /// The reasoning effort.
        reasoning_effort: Option<String>,
    },
    /// `turn/interrupt`.
    #[serde(rename = "turn/interrupt")]
    Interrupt {},
    /// `turn/steer`.
    #[serde(rename = "turn/steer")]
    Steer {
        /// The running turn.
        turn_id: String,
        /// The input's text items, one per line (steering takes text only).
        #[serde(with = "steer_text")]
        input: String,
    },
    /// `session/compact`: summarises the older conversation now (see
    /// [`crate::agent::compaction`]); refused while a turn runs, answered after
    /// `session/compacted` was sent.
    #[serde(rename = "session/compact")]
    Compact {},
    /// `session/revert`: puts the workspace back as it was before a turn (see
    /// [`crate::checkpoint`]).
    #[serde(rename = "session/revert")]
    Revert(RevertTo),
    /// `approval/respond`.
    #[serde(rename = "approval/respond")]
    RespondApproval {
        /// The approval.
        approval_id: String,
        /// The decision.
        decision: Decision,
        /// Words for the model with a decline.
        #[serde(default)]
        message: Option<String>,
    },
    /// `user_input/respond`: the user's answers to a pending `request_user_input`.
    #[serde(rename = "user_input/respond")]
    RespondUserInput {
        /// The question.
        request_id: String,
        /// The answers.
        answers: Value,
    },
    /// Stops one of the session's running tasks (not a client's: the WebSocket's `task/cancel`
    /// also reaches tasks no actor runs).
    #[serde(rename = "node/cancel_task")]
    CancelTask {
        /// The task.
        task_id: String,
    },
    /// A method this node does not have: sent by a node of another version, say. Its params
    /// are skipped unread, and the actor answers `method_not_found`.
    #[serde(other, deserialize_with = "skip_params", skip_serializing)]
    Unknown,
}

/// The prefix of the methods only nodes send each other: a client asking for one is told
/// there is no such method.
pub const NODE_METHODS: &str = "node/";

/// `session/revert`'s params: the turn whose start the workspace goes back to. Answered
/// `{files: [{path, change}]}`, what was (or with `dry_run`, would be) undone; files changed
/// since the session's last turn ended are a conflict that refuses it unless `force`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RevertTo {
    /// The turn whose start the workspace goes back to.
    pub turn_id: String,
    /// Only say what would change.
    #[serde(default)]
    pub dry_run: bool,
    /// Revert over files changed since the last turn ended.
    #[serde(default)]
    pub force: bool,
}

/// `turn/start`'s `_meta`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TurnMeta {
    /// A W3C trace context the turn's `invoke_agent` span continues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

impl TurnMeta {
    /// Whether it carries nothing.
    fn is_empty(&self) -> bool {
        self.traceparent.is_none()
    }
}

/// What a turn starts with: the text items, one per line, and the images. On the wire it is
/// `turn/start`'s `input`, a list of `{kind: "text", text}` and `{kind: "image", mime, data}` or
/// `{kind: "image", path}` items, checked as it is read: at least one item, at most
/// [`MAX_INPUT_IMAGES`] images, each inline image a real image of its type.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<InputItem>", into = "Vec<InputItem>")]
pub struct TurnInput {
    /// The text items, one per line.
    pub text: String,
    /// The images, in order.
    pub images: Vec<ImageInput>,
}

/// Why a turn's input is refused: the words `turn/start` answers.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InputRefused(String);

/// One item of a turn's input, as the client writes it.
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum InputItem {
    Text {
        text: String,
    },
    Image {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mime: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        path: Option<String>,
    },
}

impl TurnInput {
    /// Reads `turn/start`'s `input` from JSON; a refusal reads as `turn/start` answers it.
    pub fn from_json(input: Value) -> Result<Self, InputRefused> {
        let items: Vec<InputItem> =
            serde_json::from_value(input).map_err(|err| InputRefused(format!("input: {err}")))?;
        Self::try_from(items)
    }
}

impl TryFrom<Vec<InputItem>> for TurnInput {
    type Error = InputRefused;

    fn try_from(items: Vec<InputItem>) -> Result<Self, InputRefused> {
        let mut images = Vec::new();
        let mut text = Vec::new();
        for item in items {
            match item {
                InputItem::Text { text: line } => text.push(line),
                InputItem::Image { mime, data, path } => {
                    images.push(image_input(images.len(), mime, data, path)?);
                }
            }
        }
        if text.is_empty() && images.is_empty() {
            return Err(InputRefused(
                "input needs at least one {kind: \"text\", text} or {kind: \"image\"} item".into(),
            ));
        }
        if images.len() > MAX_INPUT_IMAGES {
            return Err(InputRefused(format!(
                "input has {} images; at most {MAX_INPUT_IMAGES} are taken",
                images.len()
            )));
        }
        Ok(Self {
            text: text.join("\n"),
            images,
        })
    }
}

impl From<TurnInput> for Vec<InputItem> {
    fn from(input: TurnInput) -> Self {
        let text = (!input.text.is_empty()).then_some(InputItem::Text { text: input.text });
        let images = input.images.into_iter().map(|image| match image {
            ImageInput::Inline(image) => InputItem::Image {
                mime: Some(image.mime),
                data: Some(image.data),
                path: None,
            },
            ImageInput::Path { path } => InputItem::Image {
                mime: None,
                data: None,
                path: Some(path),
            },
        });
        text.into_iter().chain(images).collect()
    }
}

/// One image item, checked: `{mime, data}` inline or `{path}` in the workspace, not both.
fn image_input(
    index: usize,
    mime: Option<String>,
    data: Option<String>,
    path: Option<String>,
) -> Result<ImageInput, InputRefused> {
    let refuse = |problem: String| InputRefused(format!("input image {index}: {problem}"));
    match (mime, data, path) {
        (Some(mime), Some(data), None) => ImageData::from_base64(&mime, &data)
            .map(ImageInput::Inline)
            .map_err(|err| refuse(err.to_string())),
        (None, None, Some(path)) if !path.is_empty() => Ok(ImageInput::Path { path }),
        _ => Err(refuse(
            "give either {mime, data} (base64) or {path} (relative to the workspace)".into(),
        )),
    }
}

/// `turn/steer`'s `input`: text items only, one per line.
mod steer_text {
    use super::InputItem;
    use serde::{Deserialize, Deserializer, Serialize, Serializer, de::Error};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<String, D::Error> {
        let mut text = Vec::new();
        for item in Vec::<InputItem>::deserialize(deserializer)? {
            match item {
                InputItem::Text { text: line } => text.push(line),
                InputItem::Image { .. } => {
                    return Err(D::Error::custom(
                        "turn/steer takes text items only; send images with turn/start",
                    ));
                }
            }
        }
        if text.is_empty() {
            return Err(D::Error::custom(
                "input needs at least one {kind: \"text\", text} item",
            ));
        }
        Ok(text.join("\n"))
    }

    pub(super) fn serialize<S: Serializer>(text: &str, serializer: S) -> Result<S::Ok, S::Error> {
        [InputItem::Text {
            text: text.to_string(),
        }]
        .serialize(serializer)
    }
}

fn skip_params<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<(), D::Error> {
    serde::de::IgnoredAny::deserialize(deserializer).map(|_| ())
}

/// What a session answers a [`SessionRequest`], by request.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "reply", content = "value", rename_all = "snake_case")]
pub enum SessionReply {
    /// `Describe`: what `session/open` reports.
    View(Box<SessionView>),
    /// `InvokeTool`: the call's result.
    Invoked(Box<InvokeResult>),
    /// `ToolList`: the `tool/list` answer.
    ToolList(Value),
    /// `StartTurn`: the turn's id, once `turn/started` is out.
    TurnStarted(String),
    /// `Interrupt`: whether a turn was running.
    Interrupted(bool),
    /// `Compact`: what the compaction did, after `session/compacted`.
    Compacted(CompactionStats),
    /// `Revert`: `{files: [{path, change}]}`.
    Reverted(Value),
    /// `CancelTask`: the task's final state, or `None` when it was not running.
    TaskCancelled(Option<TaskState>),
    /// Done, with nothing to say (`SetModel`, `Steer`, `RespondApproval`, `RespondUserInput`).
    Done,
}

impl SessionRequest {
    /// An `InvokeTool` of `name` with `arguments` and the caller's `options`.
    pub fn invoke(name: String, arguments: Value, options: InvokeOptions) -> Self {
        Self::InvokeTool {
            name,
            arguments,
            tool_call_id: options.tool_call_id,
            skip_approval: options.skip_approval,
            cancel: options.cancel,
        }
    }

    /// A `SetModel` of `choice`.
    pub fn set_model(choice: ModelChoice) -> Self {
        Self::SetModel {
            model: choice.model,
            reasoning_effort: choice.reasoning_effort,
        }
    }

    /// Reads a client's request from its `{"method", "params"}` (the params less the
    /// `session_id`): `Ok(None)` when no session method has that name, and for the methods only
    /// nodes send each other ([`NODE_METHODS`]). A client does not name its call ids.
    pub fn from_client(request: Value) -> Result<Option<Self>, serde_json::Error> {
        let method = request.get("method").and_then(Value::as_str);
        if method.is_some_and(|method| method.starts_with(NODE_METHODS)) {
            return Ok(None);
        }
        // An unknown method reads whatever its params, so an error is a known method's.
        let request = serde_json::from_value(request)?;
        Ok(match request {
            Self::InvokeTool {
                name,
                arguments,
                skip_approval,
                ..
            } => Some(Self::InvokeTool {
                name,
                arguments,
                skip_approval,
                tool_call_id: None,
                cancel: None,
            }),
            Self::Unknown => None,
            request => Some(request),
        })
    }

    /// Whether `method` names a session method a client may send (its params unread).
    pub fn is_client_method(method: &str) -> bool {
        !method.starts_with(NODE_METHODS)
            && !matches!(
                serde_json::from_value(json!({"method": method})),
                Ok(Self::Unknown)
            )
    }

    /// Whether it may take long (a tool's run, a summary call): its caller waits for it
    /// without holding up what it reads next.
    pub fn runs_long(&self) -> bool {
        matches!(self, Self::InvokeTool { .. } | Self::Compact {})
    }

    /// The model it chose, for the requests that choose one.
    pub fn model_choice(&self) -> Option<ModelChoice> {
        match self {
            Self::StartTurn {
                model,
                reasoning_effort,
                ..
            }
            | Self::SetModel {
                model,
                reasoning_effort,
            } => Some(ModelChoice {
                model: model.clone(),
                reasoning_effort: reasoning_effort.clone(),
            }),
            _ => None,
        }
    }

    /// The trace context it continues, for the calls that carry one.
    pub fn traceparent(&self) -> Option<&str> {
        match self {
            Self::StartTurn { meta, .. } => meta.traceparent.as_deref(),
            _ => None,
        }
    }

    /// Continues the trace `traceparent` names (the forwarding node's span, from the request's
    /// header) in place of the one the call carried.
    pub fn continue_trace(&mut self, from: String) {
        if let Self::StartTurn { meta, .. } = self {
            meta.traceparent = Some(from);
        }
    }

    /// Its method's name, for spans.
    pub fn method(&self) -> &'static str {
        match self {
            Self::Describe {} => "node/describe",
            Self::InvokeTool { .. } => "tool/invoke",
            Self::ToolList {} => "tool/list",
            Self::StartTurn { .. } => "turn/start",
            Self::SetModel { .. } => "node/set_model",
            Self::Interrupt {} => "turn/interrupt",
            Self::Steer { .. } => "turn/steer",
            Self::Compact {} => "session/compact",
            Self::Revert(_) => "session/revert",
            Self::RespondApproval { .. } => "approval/respond",
            Self::RespondUserInput { .. } => "user_input/respond",
            Self::CancelTask { .. } => "node/cancel_task",
            Self::Unknown => "unknown",
        }
    }
}

impl SessionReply {
    /// The JSON-RPC `result` of the method the request came from.
    pub fn into_wire(self) -> Value {
        match self {
            Self::View(view) => json!(view),
            Self::Invoked(result) => json!(result),
            Self::ToolList(list) | Self::Reverted(list) => list,
            Self::TurnStarted(turn_id) => json!({ "turn_id": turn_id }),
            Self::Interrupted(interrupted) => json!({ "interrupted": interrupted }),
            Self::Compacted(stats) => json!(stats),
            Self::TaskCancelled(state) => json!(state),
            Self::Done => json!({}),
        }
    }

    /// An answer of a kind the request cannot have: a node of another version, say.
    pub(crate) fn unexpected(self) -> SessionError {
        SessionError::remote("internal", format!("an answer of the wrong kind: {self:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_travel_between_nodes_as_they_are_but_for_the_cancel_token() {
        let image = ImageData::from_bytes(crate::llm::PIXEL_PNG).unwrap();
        let requests = [
            SessionRequest::Describe {},
            SessionRequest::invoke(
                "shell".into(),
                json!({"command": "ls"}),
                InvokeOptions {
                    tool_call_id: Some("call_1".into()),
                    cancel: Some(tokio_util::sync::CancellationToken::new()),
                    skip_approval: true,
                },
            ),
            SessionRequest::StartTurn {
                input: TurnInput {
                    text: "hi\nthere".into(),
                    images: vec![
                        ImageInput::Inline(image),
                        ImageInput::Path {
                            path: "shot.png".into(),
                        },
                    ],
                },
                turn_id: Some("t1".into()),
                model: Some("local/m".into()),
                reasoning_effort: Some("low".into()),
                meta: TurnMeta {
                    traceparent: Some(
                        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
                    ),
                },
            },
            SessionRequest::Steer {
                turn_id: "t1".into(),
                input: "more".into(),
            },
            SessionRequest::Revert(RevertTo {
                turn_id: "t1".into(),
                dry_run: true,
                force: false,
            }),
            SessionRequest::RespondApproval {
                approval_id: "a1".into(),
                decision: Decision::Decline,
                message: Some("no".into()),
            },
            SessionRequest::CancelTask {
                task_id: "task_1".into(),
            },
        ];
        for request in requests {
            let wire = serde_json::to_value(&request).unwrap();
            assert_eq!(wire["method"], request.method(), "{wire}");
            let back: SessionRequest = serde_json::from_value(wire.clone()).unwrap();
            assert_eq!(serde_json::to_value(&back).unwrap(), wire);
            if let SessionRequest::InvokeTool {
                cancel,
                tool_call_id,
                ..
            } = back
            {
                assert!(cancel.is_none(), "a token does not travel");
                assert_eq!(
                    tool_call_id.as_deref(),
                    Some("call_1"),
                    "a node's call id does"
                );
                assert_eq!(wire["params"]["skip_approval"], true);
            }
        }
    }

    #[test]
    fn between_nodes_a_clients_request_is_in_its_wire_form() {
        let request = SessionRequest::from_client(json!({
            "method": "turn/steer",
            "params": {"turn_id": "t1", "input": [{"kind": "text", "text": "more"}]},
        }))
        .unwrap()
        .unwrap();
        assert_eq!(
            serde_json::to_value(&request).unwrap(),
            json!({
                "method": "turn/steer",
                "params": {"turn_id": "t1", "input": [{"kind": "text", "text": "more"}]},
            })
        );
    }

    #[test]
    fn a_method_a_node_does_not_have_is_read_and_answered_as_unknown() {
        let from_newer: SessionRequest =
            serde_json::from_value(json!({"method": "turn/rewind", "params": {"to": 3}})).unwrap();
        assert!(matches!(from_newer, SessionRequest::Unknown));
        assert!(!SessionRequest::is_client_method("turn/rewind"));
        assert!(!SessionRequest::is_client_method("node/describe"));
        assert!(SessionRequest::is_client_method("tool/invoke"));
        assert!(SessionRequest::is_client_method("tool/list"));
    }

    #[test]
    fn each_reply_is_its_methods_result_on_the_wire_and_survives_the_trip() {
        let cases = [
            (
                SessionReply::TurnStarted("t1".into()),
                json!({"turn_id": "t1"}),
            ),
            (
                SessionReply::Interrupted(false),
                json!({"interrupted": false}),
            ),
            (SessionReply::Done, json!({})),
            (
                SessionReply::ToolList(json!({"active": []})),
                json!({"active": []}),
            ),
            (
                SessionReply::TaskCancelled(Some(TaskState::Cancelled)),
                json!("cancelled"),
            ),
            (SessionReply::TaskCancelled(None), Value::Null),
        ];
        for (reply, result) in cases {
            let between_nodes = serde_json::to_value(&reply).unwrap();
            let back: SessionReply = serde_json::from_value(between_nodes).unwrap();
            assert_eq!(back.into_wire(), result);
        }
    }

    #[test]
    fn an_answer_of_the_wrong_kind_is_an_internal_error() {
        let err = SessionReply::Done.unexpected();
        assert_eq!(err.kind(), crate::error_kind::ErrorKind::Internal);
    }
}
