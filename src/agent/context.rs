//! What of a conversation is sent to the model: a stored history repaired into a valid
//! conversation, fitted to the context window, and tool output capped for it.

use crate::llm::pricing::Pricing;
use crate::llm::{ChatMessage, ToolSpec};

/// Most bytes of one tool result placed into the history; the head and tail are kept.
pub const MAX_TOOL_OUTPUT_IN_HISTORY: usize = 32 * 1024;

/// The messages of the next request: the system prompt and as much of the history, newest
/// last, as the estimate says fits in `room` prompt tokens with `tools`. The oldest messages go
/// first, a model answer always together with the tool results that follow it, so what is
/// sent stays a valid conversation; the system prompt then says how many were left out. The
/// newest exchange is always sent, fitting or not (the endpoint then says the context is too
/// long). The stored history is untouched. `measured` is the estimate of the whole request
/// when the caller has made it already: within `room`, nothing is measured again.
pub(crate) fn fit_context(
    system: &str,
    history: Vec<ChatMessage>,
    tools: &[ToolSpec],
    room: u64,
    measured: Option<u64>,
) -> (Vec<ChatMessage>, u64) {
    if let Some(estimate) = measured.filter(|estimate| *estimate <= room) {
        return (with_system(system, history), estimate);
    }
    // Each message is measured once; the trials below only add up sizes.
    let tool_bytes: u64 = tools.iter().map(Pricing::json_bytes).sum();
    let estimate = |system: &ChatMessage, history_bytes: u64, history_len: usize| {
        Pricing::tokens_from_parts(
            Pricing::json_bytes(system) + history_bytes,
            history_len + 1,
            tool_bytes,
            tools.len(),
        )
    };
    let sizes: Vec<u64> = history.iter().map(Pricing::message_bytes).collect();
    // after[i]: the bytes of history[i..].
    let mut after = vec![0u64; sizes.len() + 1];
    for at in (0..sizes.len()).rev() {
        after[at] = after[at + 1] + sizes[at];
    }
    let whole = ChatMessage::System {
        content: system.to_string(),
    };
    let whole_estimate = estimate(&whole, after[0], history.len());
    if whole_estimate <= room {
        return (with_system(system, history), whole_estimate);
    }
    // Where each droppable exchange starts: any message but a tool result.
    let starts: Vec<usize> = (0..history.len())
        .filter(|&at| !matches!(history[at], ChatMessage::Tool { .. }))
        .collect();
    let note = |dropped: usize| ChatMessage::System {
        content: format!(
            "{system}\n\n({dropped} earlier messages of this conversation were left out to fit \
             the model's context window.)"
        ),
    };
    let mut keep_from = 0;
    let mut kept_estimate = whole_estimate;
    for &start in starts.iter().skip(1) {
        keep_from = start;
        kept_estimate = estimate(&note(start), after[start], history.len() - start);
        if kept_estimate <= room {
            break;
        }
    }
    if keep_from == 0 {
        return (with_system(system, history), whole_estimate);
    }
    tracing::info!(dropped = keep_from, "history trimmed to the context window");
    let mut trimmed = vec![note(keep_from)];
    trimmed.extend(history.into_iter().skip(keep_from));
    (trimmed, kept_estimate)
}

/// The system prompt, then `history`.
fn with_system(system: &str, history: Vec<ChatMessage>) -> Vec<ChatMessage> {
    let mut messages = Vec::with_capacity(history.len() + 1);
    messages.push(ChatMessage::System {
        content: system.to_string(),
    });
    messages.extend(history);
    messages
}

/// What a tool call whose result was never stored answers in the history.
const UNRECORDED_RESULT: &str = "interrupted: no result was recorded for this call";

/// Makes a stored conversation valid for a model: every tool call answered exactly once, after
/// the assistant message that made it and before the next other message, and tool messages no
/// call asked for dropped. A crash between an assistant message and its tool messages would
/// otherwise make every later request of the session fail.
pub(crate) fn repair(history: Vec<ChatMessage>) -> Vec<ChatMessage> {
    let mut repaired = Vec::with_capacity(history.len());
    let mut unanswered: Vec<String> = Vec::new();
    for message in history {
        match &message {
            ChatMessage::Tool { tool_call_id, .. } => {
                if let Some(at) = unanswered.iter().position(|id| id == tool_call_id) {
                    unanswered.remove(at);
                    repaired.push(message);
                }
            }
            _ => {
                for id in unanswered.drain(..) {
                    repaired.push(ChatMessage::Tool {
                        tool_call_id: id,
                        content: UNRECORDED_RESULT.into(),
                    });
                }
                if let ChatMessage::Assistant { tool_calls, .. } = &message {
                    unanswered.extend(tool_calls.iter().map(|call| call.id.clone()));
                }
                repaired.push(message);
            }
        }
    }
    for id in unanswered {
        repaired.push(ChatMessage::Tool {
            tool_call_id: id,
            content: UNRECORDED_RESULT.into(),
        });
    }
    repaired
}

/// `text` cut to at most `limit` bytes at a character boundary, with an ellipsis when cut.
pub(crate) fn cap_text(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    // The ellipsis is three bytes, and the whole must stay within the limit.
    let mut cut = limit.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &text[..cut])
}

/// Keeps a tool's output within [`MAX_TOOL_OUTPUT_IN_HISTORY`]: the head and the tail, with
/// what was dropped said in between, so one huge result cannot overflow the context.
pub fn cap_output(output: &str) -> String {
    if output.len() <= MAX_TOOL_OUTPUT_IN_HISTORY {
        return output.to_string();
    }
    let half = MAX_TOOL_OUTPUT_IN_HISTORY / 2;
    let mut head_end = half;
    while !output.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = output.len() - half;
    while !output.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    format!(
        "{}\n[… {} bytes omitted …]\n{}",
        &output[..head_end],
        tail_start - head_end,
        &output[tail_start..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::ToolCall;

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "read_file".into(),
            arguments: "{}".into(),
        }
    }

    fn tool(id: &str, content: &str) -> ChatMessage {
        ChatMessage::Tool {
            tool_call_id: id.into(),
            content: content.into(),
        }
    }

    #[test]
    fn a_history_cut_by_a_crash_is_repaired() {
        let user = |text: &str| ChatMessage::User {
            content: text.into(),
            images: Vec::new(),
        };
        let assistant = |ids: &[&str]| ChatMessage::Assistant {
            reasoning: None,
            content: None,
            tool_calls: ids.iter().map(|id| call(id)).collect(),
        };
        let stored = vec![
            user("go"),
            assistant(&["a", "b"]),
            tool("a", "ok"),
            tool("stray", "nobody asked"),
            user("again"),
            assistant(&["c"]),
        ];
        assert_eq!(
            repair(stored),
            vec![
                user("go"),
                assistant(&["a", "b"]),
                tool("a", "ok"),
                tool("b", UNRECORDED_RESULT),
                user("again"),
                assistant(&["c"]),
                tool("c", UNRECORDED_RESULT),
            ]
        );
        let whole = vec![user("x"), assistant(&["a"]), tool("a", "ok")];
        assert_eq!(repair(whole.clone()), whole, "a valid history is unchanged");
    }

    #[test]
    fn the_oldest_exchanges_give_way_to_the_context_window() {
        let user = |text: &str| ChatMessage::User {
            content: text.into(),
            images: Vec::new(),
        };
        let assistant = |ids: &[&str]| ChatMessage::Assistant {
            reasoning: None,
            content: Some("x".repeat(300)),
            tool_calls: ids.iter().map(|id| call(id)).collect(),
        };
        let history = vec![
            user(&"a".repeat(3000)),
            assistant(&["1"]),
            tool("1", &"r".repeat(3000)),
            user("second"),
            assistant(&[]),
            user("third"),
        ];
        let (whole, estimate) = fit_context("sys", history.clone(), &[], u64::MAX, None);
        assert_eq!(whole.len(), 7, "everything fits an unlimited window");
        assert_eq!(estimate, Pricing::estimate_prompt_tokens(&whole, &[]));

        // A caller's own estimate is taken as it is when it fits, and ignored when it does not.
        let (again, known) = fit_context("sys", history.clone(), &[], u64::MAX, Some(estimate));
        assert_eq!((&again, known), (&whole, estimate));
        let (fitted, estimate) = fit_context("sys", history.clone(), &[], 400, Some(estimate));
        assert_eq!(estimate, Pricing::estimate_prompt_tokens(&fitted, &[]));
        let ChatMessage::System { content } = &fitted[0] else {
            panic!("the system prompt comes first");
        };
        assert!(
            content.starts_with("sys\n\n(3 earlier messages"),
            "{content}"
        );
        // The assistant answer went with its tool result: no unanswered or stray tool message.
        assert_eq!(&fitted[1..], &history[3..]);

        let (nothing_fits, estimate) = fit_context("sys", history.clone(), &[], 1, None);
        assert_eq!(
            estimate,
            Pricing::estimate_prompt_tokens(&nothing_fits, &[])
        );
        assert_eq!(
            &nothing_fits[1..],
            &history[5..],
            "the newest exchange is sent anyway"
        );
    }

    #[test]
    fn short_output_is_kept_whole() {
        assert_eq!(cap_output("hello"), "hello");
    }

    #[test]
    fn long_output_keeps_head_and_tail_and_says_what_was_dropped() {
        let output = format!(
            "{}{}{}",
            "a".repeat(20_000),
            "b".repeat(10_000),
            "é".repeat(10_000)
        );
        let capped = cap_output(&output);
        assert!(capped.len() <= MAX_TOOL_OUTPUT_IN_HISTORY + 64);
        assert!(capped.starts_with(&"a".repeat(1000)));
        assert!(capped.ends_with("é"));
        assert!(
            capped.contains("[… 17232 bytes omitted …]"),
            "{}",
            &capped[16_000..16_500]
        );
    }
}
