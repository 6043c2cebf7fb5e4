//! A sub-agent's side of the turn loop: the same [`Turn`](super::Turn) as a session's own,
//! hosted over a registry the child owns, with its history in memory and a readable transcript
//! in its task's output file.

use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::{RwLock, mpsc};

use super::approval::{Answer, ApprovalAsk, Unanswered};
use super::call::{CallHost, EventSink, Spawn};
use super::compaction::Compacted;
use super::context::{cap_text, repair};
use super::event::SessionEvent;
use super::{HistoryError, TurnHost};
use crate::llm::ChatMessage;
use crate::mutex::lock;
use crate::tasks::spool::OutputSpool;
use crate::tasks::supervisor::RunFailure;
use crate::tasks::supervisor::TaskReport;
use crate::tools::{
    CatalogCell, DispatchError, PreparedCall, ToolError, ToolEvent, ToolRegistry, ToolResult,
    ToolSpec,
};

/// Most bytes of one tool result's first line written to a transcript.
const TRANSCRIPT_PREVIEW: usize = 300;

/// The instructions a child's conversation starts with.
const SUB_AGENT_PROMPT: &str = "You are a sub-agent: another agent handed you the task in the \
first user message and reads only your final answer. Work in the workspace with the tools you \
have (you cannot run shell commands, start agents or ask the user), and end with a plain answer \
that says what you found or did.";

/// How one run of a child ended, as the host saw it say so.
#[derive(Debug, Default)]
struct RunRecord {
    /// The text of its last model answer.
    last_text: Option<String>,
    /// `Some(Ok)` after `turn/completed`, `Some(Err(why))` after `turn/error`.
    ending: Option<Result<(), RunFailure>>,
}

/// One child agent's state that outlives its runs.
pub(crate) struct ChildHost<P> {
    /// The sub-agent prompt, then its profile's instructions.
    system: String,
    agent_id: String,
    registry: Mutex<ToolRegistry>,
    catalog: CatalogCell,
    history: Mutex<Vec<ChatMessage>>,
    /// The history's copy on disk, so the child can go on after a restart.
    journal: Mutex<HistoryJournal>,
    /// Messages from `send_input` not yet read by the child's model.
    inbox: Mutex<Vec<String>>,
    transcript: tokio::sync::Mutex<OutputSpool>,
    reports: mpsc::Sender<TaskReport>,
    record: Mutex<RunRecord>,
    /// The child's own Safe/Exclusive rule for its batches.
    exclusivity: Arc<RwLock<()>>,
    /// The parent session's actor, whose clients decide the child's approvals.
    parent: P,
}

impl<P: CallHost> ChildHost<P> {
    /// A child with no history yet, writing its transcript to `transcript` and reporting its
    /// output on `reports`.
    pub(crate) fn new(
        agent_id: String,
        registry: ToolRegistry,
        transcript: OutputSpool,
        journal: HistoryJournal,
        reports: mpsc::Sender<TaskReport>,
        parent: P,
        instructions: Option<String>,
    ) -> Self {
        let system = match instructions {
            Some(own) => format!("{SUB_AGENT_PROMPT}\n\n{own}"),
            None => SUB_AGENT_PROMPT.to_string(),
        };
        Self {
            agent_id,
            system,
            catalog: registry.catalog_cell(),
            registry: Mutex::new(registry),
            history: Mutex::new(journal.messages.clone()),
            journal: Mutex::new(journal),
            inbox: Mutex::new(Vec::new()),
            transcript: tokio::sync::Mutex::new(transcript),
            reports,
            record: Mutex::new(RunRecord::default()),
            exclusivity: Arc::new(RwLock::new(())),
            parent,
        }
    }

    /// The child's live catalog, for its discovery tools.
    pub(crate) fn catalog(&self) -> CatalogCell {
        self.catalog.clone()
    }

    /// The lock the child's own tool calls share.
    pub(crate) fn exclusivity(&self) -> Arc<RwLock<()>> {
        Arc::clone(&self.exclusivity)
    }

    /// Queues a message for the child's next model call.
    pub(crate) fn deliver(&self, message: String) {
        lock(&self.inbox).push(message);
    }

    /// Whether messages wait that no run has read yet.
    pub(crate) fn has_mail(&self) -> bool {
        !lock(&self.inbox).is_empty()
    }

    /// Drops undelivered messages (the child was stopped).
    pub(crate) fn clear_inbox(&self) {
        lock(&self.inbox).clear();
    }

    /// Forgets the last run's record before a new one starts.
    pub(crate) fn begin_run(&self) {
        *lock(&self.record) = RunRecord::default();
    }

    /// How the run that just ended finished: its answer, or why it failed.
    pub(crate) fn take_ending(&self) -> Result<Option<String>, RunFailure> {
        let record = std::mem::take(&mut *lock(&self.record));
        match record.ending {
            Some(Ok(())) => Ok(record.last_text),
            Some(Err(why)) => Err(why),
            None => Err(RunFailure {
                kind: None,
                message: "the run ended without saying how".into(),
            }),
        }
    }

    /// Appends to the transcript and reports it as task output.
    pub(crate) async fn write(&self, text: &str) {
        let mut spool = self.transcript.lock().await;
        let offset = spool.total_bytes();
        if let Err(err) = spool.append(text.as_bytes()).await {
            tracing::error!(%err, agent_id = %self.agent_id, "transcript not written");
            return;
        }
        let _ = self
            .reports
            .send(TaskReport::Output {
                task_id: self.agent_id.clone(),
                offset,
                text: text.to_string(),
            })
            .await;
    }

    async fn write_user(&self, text: &str) {
        self.write(&format!("user: {text}\n")).await;
    }
}

/// The first line of `text`, cut to a transcript's preview size.
fn first_line(text: &str) -> String {
    cap_text(text.lines().next().unwrap_or_default(), TRANSCRIPT_PREVIEW)
}

impl<P: CallHost> EventSink for ChildHost<P> {
    async fn tool_event(&self, event: ToolEvent) {
        match event {
            ToolEvent::Output { text, .. } => self.write(&text).await,
            ToolEvent::PlanUpdated { plan, .. } => self.write(&format!("plan: {plan}\n")).await,
            // Nobody answers a child's questions; dropping the reply says so to the tool.
            ToolEvent::UserInputRequested { .. } | ToolEvent::Progress { .. } => {}
            ToolEvent::SubAgent(request) => request.refuse(ToolError::model(
                "policy_denied",
                "a sub-agent cannot start or steer agents",
            )),
        }
    }
}

impl<P: CallHost> CallHost for ChildHost<P> {
    async fn emit(&self, event: SessionEvent) {
        let line = match event {
            SessionEvent::MessageCompleted { text, .. } => {
                let line = format!("assistant: {text}\n");
                lock(&self.record).last_text = Some(text);
                line
            }
            SessionEvent::ToolStarted {
                tool_name,
                arguments,
                ..
            } => format!("-> {tool_name} {arguments}\n"),
            SessionEvent::ToolCompleted(done) => format!(
                "<- {} {} in {} ms: {}\n",
                done.tool_name,
                if done.success { "succeeded" } else { "failed" },
                done.duration_ms,
                first_line(&done.output_preview)
            ),
            SessionEvent::TurnCompleted {
                tokens_in,
                tokens_out,
                cost_usd,
                ..
            } => {
                lock(&self.record).ending = Some(Ok(()));
                format!(
                    "[turn completed: {tokens_in} tokens in, {tokens_out} out, {cost_usd:.6} USD]\n"
                )
            }
            SessionEvent::TurnError { code, message, .. } => {
                let line = format!("[turn failed ({code}): {message}]\n");
                lock(&self.record).ending = Some(Err(RunFailure {
                    kind: Some(code),
                    message,
                }));
                line
            }
            // Deltas repeat what message/completed says whole; tool lists are not the story.
            _ => return,
        };
        self.write(&line).await;
    }

    /// Asked of the parent session's clients, naming the child.
    async fn ask_approval(&self, mut ask: ApprovalAsk) -> Option<Answer> {
        ask.agent_id = Some(self.agent_id.clone());
        self.parent.ask_approval(ask).await
    }

    async fn withdraw_approval(&self, approval_id: String, reason: Unanswered) {
        self.parent.withdraw_approval(approval_id, reason).await;
    }

    async fn spawn(&self, spawn: Spawn) -> ToolResult {
        // The child's registry has no spawn_only marks; this is a guard, not a path.
        ToolResult::failure(format!(
            "{} cannot run in the background inside a sub-agent",
            spawn.call.name()
        ))
    }
}

impl<P: CallHost + 'static> TurnHost for ChildHost<P> {
    fn system_prompt(&self) -> &str {
        &self.system
    }

    async fn begin_iteration(&self, turn_start: bool) -> Option<Arc<[ToolSpec]>> {
        Some(lock(&self.registry).next_request(turn_start).0)
    }

    async fn prepare(
        &self,
        name: &str,
        arguments: &Value,
    ) -> Option<Result<PreparedCall, DispatchError>> {
        let prepared = lock(&self.registry).prepare(name, arguments);
        if let Err(refusal) = &prepared {
            self.write(&format!(
                "-> {name} {arguments}\n<- {name} refused: {refusal}\n"
            ))
            .await;
        }
        Some(prepared)
    }

    async fn history(&self) -> Result<Vec<ChatMessage>, HistoryError> {
        let mail: Vec<String> = std::mem::take(&mut *lock(&self.inbox));
        for text in &mail {
            self.write_user(text).await;
        }
        let mail: Vec<ChatMessage> = mail.into_iter().map(ChatMessage::user).collect();
        for message in &mail {
            lock(&self.journal).append(message);
        }
        let mut history = lock(&self.history);
        history.extend(mail);
        Ok(repair(history.clone()))
    }

    async fn remember(&self, message: &ChatMessage) -> Result<(), HistoryError> {
        if let ChatMessage::User { content, .. } = message {
            self.write_user(content).await;
        }
        lock(&self.journal).append(message);
        lock(&self.history).push(message.clone());
        Ok(())
    }

    async fn remember_answer(
        &self,
        message: &ChatMessage,
        _cost: &crate::store::CostRow,
    ) -> Result<bool, HistoryError> {
        // A child's history is its journal file, not the store: its parent's ledger writes
        // the row.
        self.remember(message).await.map(|()| false)
    }

    async fn compacted(
        &self,
        _turn_id: Option<&str>,
        compacted: Compacted,
    ) -> Result<(), HistoryError> {
        lock(&self.journal).append(&compacted.marker);
        super::compaction::apply(&mut lock(&self.history), &compacted.marker);
        let stats = compacted.stats;
        self.write(&format!(
            "[compacted: {} earlier messages summarised, about {} -> {} prompt tokens]\n",
            stats.replaced_messages, stats.tokens_before, stats.tokens_after
        ))
        .await;
        Ok(())
    }

    async fn finished(&self, _turn_id: &str) {}
}

/// The largest child history journal read back.
const MAX_HISTORY_BYTES: u64 = 256 * 1024 * 1024;

/// A child's history as JSON lines in `<tasks_dir>/<agent_id>.history.jsonl`, appended as it
/// grows; what a later start reads to bring the child back.
#[derive(Debug)]
pub(crate) struct HistoryJournal {
    file: Option<std::fs::File>,
    /// What the file held when it was opened.
    messages: Vec<ChatMessage>,
}

impl HistoryJournal {
    /// Opens (creating when missing) the journal of `agent_id` under `dir` and reads what it
    /// holds; a line cut by a crash is skipped. A symlink at the path is refused.
    pub(crate) fn open(dir: &Path, agent_id: &str) -> std::io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        crate::tasks::spool::validate_task_id(agent_id)?;
        let path = dir.join(format!("{agent_id}.history.jsonl"));
        std::fs::create_dir_all(dir)?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&path)?;
        // The journal is the server's own writing, but of what a model said: bounded like any
        // model output, far above what a compacted history holds.
        let bytes =
            crate::capped_read::read_all(&file, MAX_HISTORY_BYTES, "a sub-agent's history")?;
        let text = String::from_utf8_lossy(&bytes);
        let messages = super::compaction::model_view(
            text.lines()
                .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok()),
        );
        let mut file = file;
        if !text.is_empty() && !text.ends_with('\n') {
            // A line cut by a crash must not swallow the next one.
            std::io::Write::write_all(&mut file, b"\n")?;
        }
        Ok(Self {
            file: Some(file),
            messages,
        })
    }

    /// Whether the file held no message when it was opened.
    pub(crate) fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// The model's answer the history ends with, if it ends with one.
    pub(crate) fn last_answer(&self) -> Option<String> {
        match self.messages.last() {
            Some(ChatMessage::Assistant {
                content,
                tool_calls,
                ..
            }) if tool_calls.is_empty() => content.clone(),
            _ => None,
        }
    }

    /// Appends one message, or a compaction's marker.
    fn append(&mut self, message: &impl serde::Serialize) {
        use std::io::Write;
        let Some(file) = &mut self.file else {
            return;
        };
        let written = serde_json::to_string(message)
            .map_err(std::io::Error::other)
            .and_then(|line| file.write_all(format!("{line}\n").as_bytes()));
        if let Err(err) = written {
            // The child goes on from memory; only a later revival would miss this.
            tracing::error!(%err, "sub-agent history not written");
            self.file = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(text: &str) -> ChatMessage {
        ChatMessage::User {
            content: text.into(),
            images: Vec::new(),
        }
    }

    fn answer(text: &str) -> ChatMessage {
        ChatMessage::Assistant {
            reasoning: None,
            content: Some(text.into()),
            tool_calls: Vec::new(),
        }
    }

    #[test]
    fn the_history_journal_reopens_what_was_written_and_skips_a_cut_line() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = HistoryJournal::open(dir.path(), "agent-1").unwrap();
        assert!(journal.is_empty());
        assert_eq!(journal.last_answer(), None);
        journal.append(&user("task"));
        journal.append(&answer("done"));
        drop(journal);
        // A crash in the middle of a line leaves half of it.
        let path = dir.path().join("agent-1.history.jsonl");
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("{\"role\":\"user\",\"cont");
        std::fs::write(&path, text).unwrap();

        let mut reopened = HistoryJournal::open(dir.path(), "agent-1").unwrap();
        assert_eq!(reopened.messages, vec![user("task"), answer("done")]);
        assert_eq!(reopened.last_answer().as_deref(), Some("done"));
        reopened.append(&user("more"));
        drop(reopened);
        let again = HistoryJournal::open(dir.path(), "agent-1").unwrap();
        assert_eq!(
            again.messages,
            vec![user("task"), answer("done"), user("more")],
            "what follows a cut line is kept"
        );
    }

    #[test]
    fn a_revived_child_sees_its_compacted_history() {
        use crate::agent::compaction::{Marker, MarkerRole};
        let dir = tempfile::tempdir().unwrap();
        let mut journal = HistoryJournal::open(dir.path(), "agent-3").unwrap();
        for message in [user("a"), answer("b"), user("c"), answer("d")] {
            journal.append(&message);
        }
        journal.append(&Marker {
            role: MarkerRole::Compaction,
            summary: "a and b".into(),
            kept: 2,
        });
        journal.append(&user("e"));
        drop(journal);
        let reopened = HistoryJournal::open(dir.path(), "agent-3").unwrap();
        assert_eq!(reopened.messages.len(), 4, "{:?}", reopened.messages);
        let ChatMessage::User { content, .. } = &reopened.messages[0] else {
            panic!("the summary comes first: {:?}", reopened.messages);
        };
        assert!(content.ends_with("a and b"));
        assert_eq!(reopened.messages[1..], [user("c"), answer("d"), user("e")]);
    }

    #[test]
    fn the_history_journal_refuses_a_symlink_and_a_bad_id() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::write(&elsewhere, "").unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.path().join("agent-2.history.jsonl")).unwrap();
        assert!(HistoryJournal::open(dir.path(), "agent-2").is_err());
        assert!(HistoryJournal::open(dir.path(), "../agent-3").is_err());
    }
}
