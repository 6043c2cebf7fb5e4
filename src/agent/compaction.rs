//! Compaction: when a conversation outgrows `llm.compact_at` of the context window (or on
//! `session/compact`), the model summarises its older part into one message, which replaces
//! that part in what is sent — never in what is stored.
//!
//! The stored history keeps every message; a compaction appends a [`Marker`] to it (role
//! `compaction`), and [`model_view`] reads a stored history with its markers applied. So a
//! restart, a fork or a sub-agent's revival sees the same conversation the model saw.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::AgentSettings;
use super::context::cap_text;
use super::ledger::{CostLabels, Ledger};
use crate::error_kind::ErrorKind;
use crate::llm::pricing::Pricing;
use crate::llm::{ChatMessage, ChatRequest, ToolSpec, Usage};

/// The instructions of the summary call.
pub const COMPACTION_PROMPT: &str = "You summarise a coding agent's conversation so the agent \
can go on without it. Write a faithful, dense summary in plain text: the user's goals and \
instructions (with their exact wording where it matters), decisions taken, files and commands \
involved with what was learned from them, what is done, what failed and why, and what is still \
open. Keep names, paths, numbers and error messages exact. Do not invent anything, and do not \
address the user.";

/// The first words of the summary call's user message.
pub const COMPACTION_REQUEST: &str = "Summarise the conversation below";

/// What the summary message sent in place of the replaced part starts with.
pub const SUMMARY_HEADER: &str = "[Summary of the earlier conversation, written when it grew \
long; the messages it replaces are kept by the server but no longer sent]";

/// Messages at the end of the conversation always sent verbatim.
pub const KEEP_MESSAGES: usize = 4;

/// Most bytes of one message in the summary call's transcript.
const MAX_TRANSCRIPT_MESSAGE: usize = 4 * 1024;

/// A compaction as the stored history holds it: the summary, and how many messages before it
/// stay verbatim after it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Marker {
    /// Always `compaction`, so no reader mistakes it for a message.
    pub role: MarkerRole,
    /// The summary the model wrote.
    pub summary: String,
    /// How many of the messages before the marker (as the model saw them) stay verbatim.
    pub kept: usize,
}

/// The role word of a [`Marker`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MarkerRole {
    /// The only value.
    Compaction,
}

/// What one compaction did, as `session/compacted` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionStats {
    /// Completion tokens of the summary.
    pub summary_tokens: u64,
    /// Messages the summary replaced.
    pub replaced_messages: usize,
    /// Estimated prompt tokens of the next request before.
    pub tokens_before: u64,
    /// Estimated prompt tokens of the next request after.
    pub tokens_after: u64,
}

/// What a requested compaction came to.
pub type CompactionOutcome = Result<CompactionStats, CompactionError>;

/// Why a compaction did not happen.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CompactionError {
    /// Too little conversation before the verbatim tail.
    #[error(
        "the conversation is too short to compact: its last {KEEP_MESSAGES} messages are always kept"
    )]
    NothingToCompact,
    /// The summary call was refused by the budget.
    #[error("{0}")]
    OverBudget(String),
    /// The summary call failed or answered nothing.
    #[error("the summary call failed: {0}")]
    Failed(String),
    /// The history could not be read or the compaction not stored (a [`super::HistoryError`],
    /// kept as its kind and words so the outcome can be shared).
    #[error("{message}")]
    Store {
        /// The history error's kind.
        kind: ErrorKind,
        /// What it said.
        message: String,
    },
}

impl From<super::HistoryError> for CompactionError {
    fn from(err: super::HistoryError) -> Self {
        Self::Store {
            kind: err.kind(),
            message: err.to_string(),
        }
    }
}

impl CompactionError {
    /// The kind clients see as `data.kind`.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::NothingToCompact => ErrorKind::NothingToCompact,
            Self::OverBudget(_) => ErrorKind::BudgetExceeded,
            Self::Failed(_) => ErrorKind::CompactionFailed,
            Self::Store { kind, .. } => *kind,
        }
    }
}

/// The conversation a stored history holds for the model: its messages with each compaction
/// applied (the summary in place of what it replaced). Entries that are neither a message nor a
/// marker are skipped. Repair the result before sending it.
pub fn model_view(stored: impl IntoIterator<Item = Value>) -> Vec<ChatMessage> {
    let mut view: Vec<ChatMessage> = Vec::new();
    for value in stored {
        extend_view(&mut view, value);
    }
    view
}

/// Adds one stored history entry to a [`model_view`]: a message is appended, a compaction's
/// marker applied, anything else skipped. A view kept up to date this way is the one
/// `model_view` makes of the whole history.
pub fn extend_view(view: &mut Vec<ChatMessage>, entry: Value) {
    if entry.get("role").and_then(Value::as_str) == Some("compaction") {
        if let Ok(marker) = serde_json::from_value::<Marker>(entry) {
            apply(view, &marker);
        }
        return;
    }
    if let Ok(message) = serde_json::from_value(entry) {
        view.push(message);
    }
}

/// Puts `marker`'s summary in place of all but the last `kept` messages of `view`.
pub fn apply(view: &mut Vec<ChatMessage>, marker: &Marker) {
    let replaced = view.len().saturating_sub(marker.kept);
    view.splice(..replaced, [summary_message(&marker.summary)]);
}

/// The message sent in place of the replaced part.
fn summary_message(summary: &str) -> ChatMessage {
    ChatMessage::user(format!("{SUMMARY_HEADER}\n\n{summary}"))
}

/// Where the verbatim tail of `view` starts: the latest point that keeps at least
/// [`KEEP_MESSAGES`] and never parts a tool result from its call; `None` when fewer than two
/// messages (or only an earlier summary) would be replaced.
pub fn cut_point(view: &[ChatMessage]) -> Option<usize> {
    let latest = view.len().checked_sub(KEEP_MESSAGES)?;
    let cut = (0..=latest)
        .rev()
        .find(|&at| !matches!(view[at], ChatMessage::Tool { .. }))?;
    (cut >= 2).then_some(cut)
}

/// The replaced part as plain text for the summary call; each message capped, an earlier
/// summary included as it was sent.
fn transcript(messages: &[ChatMessage]) -> String {
    let mut text = String::new();
    for message in messages {
        let line = match message {
            ChatMessage::System { content } => format!("[system] {content}"),
            ChatMessage::User { content, images } if images.is_empty() => {
                format!("[user] {content}")
            }
            // The summary call is text only; the model is told an image was there.
            ChatMessage::User { content, images } => {
                format!("[user, with {} image(s)] {content}", images.len())
            }
            ChatMessage::Assistant {
                content,
                tool_calls,
                ..
            } => {
                let mut line = format!("[assistant] {}", content.as_deref().unwrap_or(""));
                for call in tool_calls {
                    line.push_str(&format!(
                        "\n[assistant calls {} {}] {}",
                        call.name, call.id, call.arguments
                    ));
                }
                line
            }
            ChatMessage::Tool {
                tool_call_id,
                content,
            } => format!("[result of {tool_call_id}] {content}"),
        };
        text.push_str(&cap_text(&line, MAX_TRANSCRIPT_MESSAGE));
        text.push_str("\n\n");
    }
    text
}

/// One compaction's inputs.
pub(crate) struct Compaction<'a> {
    pub settings: &'a AgentSettings,
    pub ledger: &'a Ledger,
    /// The labels of the summary call's cost row (`node_id` is set to `compaction`).
    pub labels: &'a CostLabels,
    /// The budget hold's key, unique in the session.
    pub hold: String,
    pub cancel: CancellationToken,
}

/// A summary ready to be recorded.
#[derive(Debug)]
pub(crate) struct Compacted {
    pub marker: Marker,
    pub stats: CompactionStats,
    /// The summary call's tokens.
    pub usage: Usage,
    /// What the summary call cost.
    pub cost_usd: f64,
}

impl Compaction<'_> {
    /// Summarises the older part of `view` (the conversation as the model sees it) with the
    /// session's model; `system` and `tools` are those of the next request, for the estimates.
    pub(crate) async fn run(
        &self,
        system: &str,
        view: &[ChatMessage],
        tools: &[ToolSpec],
    ) -> Result<Compacted, CompactionError> {
        let cut = cut_point(view).ok_or(CompactionError::NothingToCompact)?;
        let settings = self.settings;
        // The transcript must leave the summary room in the window.
        let room = u64::from(settings.context_window)
            .saturating_sub(u64::from(settings.max_tokens))
            .saturating_mul(crate::llm::pricing::BYTES_PER_TOKEN)
            .saturating_sub(COMPACTION_PROMPT.len() as u64 + 1024);
        let text = transcript(&view[..cut]);
        let text = tail_of(&text, room as usize);
        let request = ChatRequest {
            model: settings.model.clone(),
            messages: vec![
                ChatMessage::System {
                    content: COMPACTION_PROMPT.to_string(),
                },
                ChatMessage::user(format!(
                    "{COMPACTION_REQUEST} into one summary that will replace it.\n\n{text}"
                )),
            ],
            tools: Arc::from(Vec::new()),
            max_tokens: settings.max_tokens,
            reasoning_effort: None,
        };
        let labels = CostLabels {
            node_id: "compaction".into(),
            ..self.labels.clone()
        };
        let estimate = Pricing::estimate_prompt_tokens(&request.messages, &[]);
        let reserved = self
            .ledger
            .pricing()
            .reserve_usd(&request.model, estimate, request.max_tokens)
            .unwrap_or(0.0);
        self.ledger
            .reserve(&self.hold, &request.model, reserved, &labels)
            .await
            .map_err(|refused| CompactionError::OverBudget(refused.to_string()))?;
        // Nobody watches the summary being written.
        let (deltas, _) = mpsc::channel(1);
        let response = match settings
            .provider
            .stream_chat(request, deltas, self.cancel.child_token())
            .await
        {
            Ok(response) => response,
            Err(err) => {
                self.ledger.release(&self.hold);
                return Err(CompactionError::Failed(err.to_string()));
            }
        };
        let usage: Usage = response.usage.unwrap_or_default();
        let cost_usd = self
            .ledger
            .bill(&self.hold, &settings.model, reserved, usage, &labels)
            .await;
        let summary = response.text.trim().to_string();
        if summary.is_empty() {
            return Err(CompactionError::Failed("the model wrote no summary".into()));
        }
        let marker = Marker {
            role: MarkerRole::Compaction,
            summary,
            kept: view.len() - cut,
        };
        let system = ChatMessage::System {
            content: system.to_string(),
        };
        let estimate_of = |messages: &[ChatMessage]| {
            let mut all = Vec::with_capacity(messages.len() + 1);
            all.push(system.clone());
            all.extend_from_slice(messages);
            Pricing::estimate_prompt_tokens(&all, tools)
        };
        let mut after = view.to_vec();
        apply(&mut after, &marker);
        let stats = CompactionStats {
            summary_tokens: if usage.completion_tokens > 0 {
                usage.completion_tokens
            } else {
                Pricing::estimate_prompt_tokens(&after[..1], &[])
            },
            replaced_messages: cut,
            tokens_before: estimate_of(view),
            tokens_after: estimate_of(&after),
        };
        Ok(Compacted {
            marker,
            stats,
            usage,
            cost_usd,
        })
    }
}

/// The last `limit` bytes of `text`, at a character boundary, saying what was cut.
fn tail_of(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    let mut start = text.len() - limit;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!(
        "[… the oldest {start} bytes are left out …]\n{}",
        &text[start..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::ToolCall;
    use serde_json::json;

    fn user(text: &str) -> ChatMessage {
        ChatMessage::User {
            content: text.into(),
            images: Vec::new(),
        }
    }

    fn calls(id: &str) -> ChatMessage {
        ChatMessage::Assistant {
            reasoning: None,
            content: None,
            tool_calls: vec![ToolCall {
                id: id.into(),
                name: "read_file".into(),
                arguments: "{}".into(),
            }],
        }
    }

    fn result(id: &str) -> ChatMessage {
        ChatMessage::Tool {
            tool_call_id: id.into(),
            content: "ok".into(),
        }
    }

    #[test]
    fn the_cut_keeps_the_tail_and_never_parts_a_call_from_its_result() {
        let view = vec![
            user("a"),
            calls("1"),
            result("1"),
            user("b"),
            calls("2"),
            result("2"),
            calls("3"),
            result("3"),
            user("c"),
        ];
        // The latest start of a 4-message tail is a tool result; the cut moves back to its call.
        assert_eq!(cut_point(&view), Some(4));
        assert_eq!(
            cut_point(&view[..5]),
            None,
            "one message is not worth a summary"
        );
        assert_eq!(cut_point(&view[..3]), None);
    }

    #[test]
    fn markers_replace_what_they_summarise_and_compose() {
        let marker = |summary: &str, kept: usize| {
            serde_json::to_value(Marker {
                role: MarkerRole::Compaction,
                summary: summary.into(),
                kept,
            })
            .unwrap()
        };
        let value = |message: &ChatMessage| serde_json::to_value(message).unwrap();
        let stored = vec![
            value(&user("a")),
            value(&user("b")),
            value(&user("c")),
            marker("first", 1),
            value(&user("d")),
            marker("second", 2),
            value(&user("e")),
            json!({"role": "something else"}),
        ];
        assert_eq!(
            serde_json::to_value(Marker {
                role: MarkerRole::Compaction,
                summary: "s".into(),
                kept: 1
            })
            .unwrap(),
            json!({"role": "compaction", "summary": "s", "kept": 1})
        );
        let view = model_view(stored);
        // After the first marker: [first, c]; then d; the second keeps [c, d] under its own
        // summary, which was written from the first.
        assert_eq!(
            view,
            vec![summary_message("second"), user("c"), user("d"), user("e")]
        );
    }

    #[test]
    fn the_transcript_caps_each_message_and_keeps_the_newest_part() {
        let long = "x".repeat(10_000);
        let text = transcript(&[user(&long), calls("1"), result("1")]);
        assert!(text.len() < 5 * 1024, "{}", text.len());
        assert!(text.contains("[assistant calls read_file 1] {}"));
        assert!(text.contains("[result of 1] ok"));
        let cut = tail_of(&text, 100);
        assert!(cut.ends_with("[result of 1] ok\n\n"), "{cut}");
        assert!(cut.starts_with("[… the oldest"));
    }
}
