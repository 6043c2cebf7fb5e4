//! A session as one JSON Lines file: `GET /api/sessions/{id}/export` writes it, and
//! `POST /api/sessions/import` makes a new session of the caller's from it.
//!
//! Lines, in order: one `{"type": "session", "version": 1, …}` header (the source's id,
//! title, cwd, model, reasoning effort and times), then `{"type": "message", "message"}` for
//! each message of the model-facing history as stored (compaction markers included), then
//! `{"type": "event", "seq", "method", "params", "created_at"}` for each stored event, then
//! `{"type": "cost", …}` for each cost row, then `{"type": "task", …}` for each task record
//! (its state, exit code, reason, size and times; the output itself stays on the server), and
//! when asked the checkpoints: `{"type": "checkpoint", "manifest"}` for each and `{"type":
//! "blob", "sha256", "data"}` (base64) for each content they name, once. An
//! import renumbers the events from 1 (a pruned log has gaps) and gives their params the new
//! session's id and seq, and gives each task a new id, named so in the events' `task_id` and
//! `task_handle`.

use std::sync::Arc;

use serde_json::value::RawValue;
use serde_json::{Value, json};
use time::OffsetDateTime;

use std::collections::HashMap;

use crate::store::{CostRow, EventRow, NewEvent, SessionRow, TaskRow, TaskState};

/// The version of the format this server writes and reads.
pub const FORMAT_VERSION: u64 = 1;

/// The export of `row` with its history, events, cost rows and task records, and its
/// checkpoints when given.
pub fn export(
    row: &SessionRow,
    messages: &[Value],
    events: &[EventRow],
    costs: &[CostRow],
    tasks: &[TaskRow],
    checkpoints: Option<&crate::checkpoint::ExportedCheckpoints>,
) -> String {
    let mut out = String::new();
    let mut push = |value: Value| {
        out.push_str(&value.to_string());
        out.push('\n');
    };
    push(json!({
        "type": "session",
        "version": FORMAT_VERSION,
        "session_id": row.session_id,
        "title": row.title,
        // A worktree stays on this server: the import works where the session came from.
        "cwd": row.worktree.as_ref().map_or(&row.cwd, |worktree| &worktree.origin_cwd),
        "model": row.model,
        "reasoning_effort": row.reasoning_effort,
        "created_at": rfc3339(row.created_at),
        "updated_at": rfc3339(row.updated_at),
        "last_seq": row.last_seq,
    }));
    for message in messages {
        push(json!({"type": "message", "message": message}));
    }
    for event in events {
        push(json!({
            "type": "event",
            "seq": event.seq,
            "method": event.method,
            "params": event.params,
            "created_at": rfc3339(event.created_at),
        }));
    }
    for cost in costs {
        let mut line = json!(cost);
        line["type"] = json!("cost");
        push(line);
    }
    for task in tasks {
        let mut line = json!(task);
        line["type"] = json!("task");
        push(line);
    }
    if let Some((manifests, blobs)) = checkpoints {
        use base64::Engine as _;
        for (sha256, bytes) in blobs {
            let data = base64::engine::general_purpose::STANDARD.encode(bytes);
            push(json!({"type": "blob", "sha256": sha256, "data": data}));
        }
        for manifest in manifests {
            push(json!({"type": "checkpoint", "manifest": manifest}));
        }
    }
    out
}

fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// A parsed export, ready to become a new session.
#[derive(Debug, Default)]
pub struct Imported {
    /// The source's id, for the log.
    pub source_id: String,
    /// Its title.
    pub title: Option<String>,
    /// Its cwd, relative to the workspace root.
    pub cwd: String,
    /// Its model choice.
    pub model: Option<String>,
    /// Its reasoning effort.
    pub reasoning_effort: Option<String>,
    /// The history, as stored, each message as the JSON text it came in (parsed again one
    /// at a time when stored, so an import holds its text once rather than as a tree).
    pub messages: Vec<Box<RawValue>>,
    /// The events: method, params (as the JSON text they came in) and when.
    pub events: Vec<(String, Box<RawValue>, OffsetDateTime)>,
    /// The cost rows.
    pub costs: Vec<CostRow>,
    /// The task records, with the ids they had.
    pub tasks: Vec<TaskRow>,
    /// Each exported task id with the id its record gets here.
    pub task_ids: HashMap<String, String>,
    /// The checkpoints' manifests, as exported.
    pub checkpoints: Vec<Value>,
    /// The contents they name, by hex SHA-256.
    pub blobs: HashMap<String, Vec<u8>>,
}

impl Imported {
    /// The events as the new session `session_id` stores them: numbered from 1, their params
    /// naming the new session and seq; made one at a time, so the caller can store them in
    /// chunks without a second copy of them all.
    pub fn new_events<'a>(&'a self, session_id: &'a str) -> impl Iterator<Item = NewEvent> + 'a {
        let id: Arc<str> = session_id.into();
        self.events
            .iter()
            .enumerate()
            .map(move |(index, (method, params, created_at))| {
                let seq = index as i64 + 1;
                let mut params: Value = serde_json::from_str(params.get()).unwrap_or(Value::Null);
                if let Value::Object(fields) = &mut params {
                    fields.insert("session_id".into(), json!(session_id));
                    fields.insert("seq".into(), json!(seq));
                    for key in ["task_id", "task_handle"] {
                        if let Some(new) = fields
                            .get(key)
                            .and_then(Value::as_str)
                            .and_then(|old| self.task_ids.get(old))
                        {
                            fields.insert(key.into(), json!(new));
                        }
                    }
                }
                NewEvent {
                    session_id: Arc::clone(&id),
                    seq,
                    method: method.as_str().into(),
                    params_json: params.to_string().into(),
                    created_at: *created_at,
                }
            })
    }

    /// The task records as the new session `session_id` stores them: new ids, output at
    /// `output_path(new id)` and none of it carried (`total_bytes` 0), and a task that was
    /// running when exported failed, since nothing runs it here.
    pub fn new_tasks(
        &self,
        session_id: &str,
        output_path: impl Fn(&str) -> String,
    ) -> Vec<TaskRow> {
        self.tasks
            .iter()
            .map(|task| {
                let task_id = self.task_ids[&task.task_id].clone();
                let mut row = TaskRow {
                    output_path: output_path(&task_id),
                    task_id,
                    session_id: session_id.to_string(),
                    total_bytes: 0,
                    ..task.clone()
                };
                if row.state == TaskState::Running {
                    row.state = TaskState::Failed;
                    row.reason = Some("it was running when the session was exported".into());
                    row.finished_at = Some(crate::store::timestamp_now());
                }
                row
            })
            .collect()
    }
}

/// Why a body is not an export this server reads; each names the line at fault.
#[derive(Debug, thiserror::Error)]
pub enum ExportFormatError {
    /// Nothing but blank lines.
    #[error("the body is empty; send the JSON Lines of an export")]
    Empty,
    /// A line does not parse as JSON.
    #[error("line {line} is not JSON: {source}")]
    NotJson {
        /// Its number.
        line: usize,
        /// Why.
        source: serde_json::Error,
    },
    /// The first line is not the export's header.
    #[error("line 1 must be the {{\"type\": \"session\"}} header of an export")]
    NoHeader,
    /// The header names a format version this server does not read.
    #[error("line 1: version {0} is not one this server reads ({FORMAT_VERSION})")]
    Version(Value),
    /// A record of a known type lacks what it needs.
    #[error("line {line}: {problem}")]
    Incomplete {
        /// Its number.
        line: usize,
        /// What it lacks.
        problem: &'static str,
    },
    /// A cost row or task record that does not read as one.
    #[error("line {line}: not a {what}: {source}")]
    NotA {
        /// Its number.
        line: usize,
        /// `cost row` or `task record`.
        what: &'static str,
        /// Why.
        source: serde_json::Error,
    },
    /// One task is in the export twice.
    #[error("line {line}: task {task_id} is in the export twice")]
    DuplicateTask {
        /// Its number.
        line: usize,
        /// The task.
        task_id: String,
    },
    /// A line longer than [`MAX_LINE_BYTES`].
    #[error("line {line} is longer than {limit} bytes")]
    LineTooLong {
        /// Its number.
        line: usize,
        /// The limit.
        limit: usize,
    },
    /// A record that reads, but cannot be true (a negative cost, a time to come).
    #[error("line {line}: {problem}")]
    Implausible {
        /// Its number.
        line: usize,
        /// What is wrong.
        problem: &'static str,
    },
    /// The body broke off or passed its size limit (`FileTooLarge`) while it was read.
    #[error("the export could not be read: {0}")]
    Unreadable(std::io::Error),
    /// A record of a type exports do not have.
    #[error(
        "line {line}: unknown type {kind:?} (session, message, event, cost, task, checkpoint or blob)"
    )]
    UnknownType {
        /// Its number.
        line: usize,
        /// The type it named, if any.
        kind: Option<String>,
    },
}

/// Most bytes of one line of an export: room for a checkpoint blob of a 16 MiB file in
/// base64, or a message carrying images; a longer line is refused before it is held.
pub const MAX_LINE_BYTES: usize = 24 * 1024 * 1024;

/// How far in the future a cost row's time may lie (clocks differ between servers).
const COST_CLOCK_SKEW: time::Duration = time::Duration::minutes(5);

/// Reads an export held whole; the error names the line and what is wrong with it.
pub fn parse(body: &str) -> Result<Imported, ExportFormatError> {
    let mut reader = ExportReader::default();
    for line in body.split_inclusive('\n') {
        reader.line(line.as_bytes())?;
    }
    reader.finish()
}

/// Reads an export from a stream, one line of at most [`MAX_LINE_BYTES`] at a time, so what
/// it holds is the typed records, never the whole body nor a tree of it.
pub async fn read<R: tokio::io::AsyncBufRead + Unpin>(
    mut body: R,
) -> Result<Imported, ExportFormatError> {
    use tokio::io::AsyncBufReadExt as _;
    use tokio::io::AsyncReadExt as _;
    let mut reader = ExportReader::default();
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = (&mut body)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut line)
            .await
            .map_err(ExportFormatError::Unreadable)?;
        if read == 0 {
            break;
        }
        reader.line(&line)?;
    }
    reader.finish()
}

/// An export read a line at a time: [`ExportReader::line`] for each, then
/// [`ExportReader::finish`].
#[derive(Debug, Default)]
pub struct ExportReader {
    /// The lines seen, blank ones included, so errors name the line a person sees.
    number: usize,
    /// What the lines so far made; `None` until the header.
    imported: Option<Imported>,
}

impl ExportReader {
    /// Takes the next line (with or without its newline).
    pub fn line(&mut self, line: &[u8]) -> Result<(), ExportFormatError> {
        self.number += 1;
        let number = self.number;
        if line.len() > MAX_LINE_BYTES + 1
            || (line.len() == MAX_LINE_BYTES + 1 && line.last() != Some(&b'\n'))
        {
            return Err(ExportFormatError::LineTooLong {
                line: number,
                limit: MAX_LINE_BYTES,
            });
        }
        let text = std::str::from_utf8(line)
            .map_err(|_| ExportFormatError::Incomplete {
                line: number,
                problem: "a line must be UTF-8",
            })?
            .trim();
        if text.is_empty() {
            return Ok(());
        }
        let Some(imported) = self.imported.as_mut() else {
            self.imported = Some(header(text, number)?);
            return Ok(());
        };
        record(imported, text, number)
    }

    /// The export, once every line was read.
    pub fn finish(self) -> Result<Imported, ExportFormatError> {
        self.imported.ok_or(ExportFormatError::Empty)
    }
}

/// The `{"type": "session"}` line.
fn header(line: &str, number: usize) -> Result<Imported, ExportFormatError> {
    let header: Value =
        serde_json::from_str(line).map_err(|source| ExportFormatError::NotJson {
            line: number,
            source,
        })?;
    if header["type"] != "session" {
        return Err(ExportFormatError::NoHeader);
    }
    if header["version"].as_u64() != Some(FORMAT_VERSION) {
        return Err(ExportFormatError::Version(header["version"].clone()));
    }
    let text = |key: &str| header[key].as_str().map(str::to_string);
    Ok(Imported {
        source_id: text("session_id").unwrap_or_default(),
        title: text("title"),
        cwd: text("cwd").unwrap_or_default(),
        model: text("model"),
        reasoning_effort: text("reasoning_effort"),
        ..Imported::default()
    })
}

/// The fields of a record the reader looks at before it takes the rest as the type says.
#[derive(serde::Deserialize)]
struct RecordHead<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<std::borrow::Cow<'a, str>>,
}

/// An `event` record; its params kept as the text they came in.
#[derive(serde::Deserialize)]
struct EventRecord {
    method: Option<String>,
    params: Option<Box<RawValue>>,
    created_at: Option<String>,
}

/// A `message` record.
#[derive(serde::Deserialize)]
struct MessageRecord {
    message: Option<Box<RawValue>>,
}

/// A `blob` record.
#[derive(serde::Deserialize)]
struct BlobRecord {
    sha256: Option<String>,
    data: Option<String>,
}

/// A `checkpoint` record.
#[derive(serde::Deserialize)]
struct CheckpointRecord {
    manifest: Option<Value>,
}

/// One line after the header, into `imported`.
fn record(imported: &mut Imported, line: &str, number: usize) -> Result<(), ExportFormatError> {
    let incomplete = |problem| ExportFormatError::Incomplete {
        line: number,
        problem,
    };
    let not_json = |source| ExportFormatError::NotJson {
        line: number,
        source,
    };
    let head: RecordHead = serde_json::from_str(line).map_err(not_json)?;
    match head.kind.as_deref() {
        Some("message") => {
            let record: MessageRecord = serde_json::from_str(line).map_err(not_json)?;
            let message = record
                .message
                .ok_or_else(|| incomplete("a message record needs its message"))?;
            imported.messages.push(message);
        }
        Some("event") => {
            let record: EventRecord = serde_json::from_str(line).map_err(not_json)?;
            let method = record
                .method
                .filter(|m| !m.is_empty())
                .ok_or_else(|| incomplete("an event needs a method"))?;
            let created_at = record
                .created_at
                .and_then(|at| {
                    OffsetDateTime::parse(&at, &time::format_description::well_known::Rfc3339).ok()
                })
                .ok_or_else(|| incomplete("created_at must be RFC 3339"))?;
            let params = match record.params {
                Some(params) => params,
                None => RawValue::from_string("null".into()).map_err(not_json)?,
            };
            imported.events.push((method, params, created_at));
        }
        Some("cost") => {
            let row: CostRow =
                serde_json::from_str(line).map_err(|source| ExportFormatError::NotA {
                    line: number,
                    what: "cost row",
                    source,
                })?;
            if let Some(problem) = implausible_cost(&row) {
                return Err(ExportFormatError::Implausible {
                    line: number,
                    problem,
                });
            }
            imported.costs.push(row);
        }
        Some("task") => {
            let row: TaskRow =
                serde_json::from_str(line).map_err(|source| ExportFormatError::NotA {
                    line: number,
                    what: "task record",
                    source,
                })?;
            let fresh = uuid::Uuid::new_v4().simple().to_string();
            if imported
                .task_ids
                .insert(row.task_id.clone(), fresh)
                .is_some()
            {
                return Err(ExportFormatError::DuplicateTask {
                    line: number,
                    task_id: row.task_id,
                });
            }
            imported.tasks.push(row);
        }
        Some("checkpoint") => {
            let record: CheckpointRecord = serde_json::from_str(line).map_err(not_json)?;
            imported
                .checkpoints
                .push(record.manifest.unwrap_or(Value::Null));
        }
        Some("blob") => {
            use base64::Engine as _;
            let record: BlobRecord = serde_json::from_str(line).map_err(not_json)?;
            let sha256 = record
                .sha256
                .ok_or_else(|| incomplete("a blob needs its sha256"))?;
            let data = record
                .data
                .and_then(|data| base64::engine::general_purpose::STANDARD.decode(data).ok())
                .ok_or_else(|| incomplete("a blob's data must be base64"))?;
            imported.blobs.insert(sha256, data);
        }
        other => {
            return Err(ExportFormatError::UnknownType {
                line: number,
                kind: other.map(str::to_string),
            });
        }
    }
    Ok(())
}

/// Why a cost row cannot be what a call cost: the budgets add these rows up, so a negative
/// amount or count would lift them, and a row from the future would count in windows to come.
fn implausible_cost(row: &CostRow) -> Option<&'static str> {
    let amounts = [row.reserved_usd, row.actual_usd];
    if amounts.iter().any(|usd| !usd.is_finite() || *usd < 0.0) {
        return Some("a cost row's USD amounts must be finite and not negative");
    }
    if [row.tokens_in, row.tokens_out, row.tokens_cached]
        .iter()
        .any(|tokens| *tokens < 0)
    {
        return Some("a cost row's token counts must not be negative");
    }
    if row.created_at > OffsetDateTime::now_utc() + COST_CLOCK_SKEW {
        return Some("a cost row's created_at must not be in the future");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn an_export_reads_back_and_its_events_are_renumbered_for_the_new_session() {
        let at = OffsetDateTime::UNIX_EPOCH;
        let row = SessionRow {
            session_id: "old".into(),
            user_name: None,
            title: Some("Fix it".into()),
            cwd: "proj".into(),
            created_at: at,
            updated_at: at,
            last_seq: 9,
            parent_session_id: None,
            agent: None,
            model: Some("p/m".into()),
            reasoning_effort: None,
            worktree: None,
        };
        let events = [5, 9].map(|seq| EventRow {
            session_id: "old".into(),
            seq,
            method: "turn/started".into(),
            params: json!({"session_id": "old", "seq": seq, "turn_id": "t"}),
            created_at: at,
        });
        let mut events = events.to_vec();
        events.push(EventRow {
            session_id: "old".into(),
            seq: 10,
            method: "task/updated".into(),
            params: json!({"session_id": "old", "seq": 10, "task_id": "task-1", "state": "running"}),
            created_at: at,
        });
        let task = TaskRow {
            exit_code: Some(0),
            ..TaskRow::running("task-1", "old", "call-1", "shell", Path::new("/tmp/x.log"))
        };
        let body = export(
            &row,
            &[json!({"role": "user", "content": "hi"})],
            &events,
            &[],
            std::slice::from_ref(&task),
            None,
        );
        assert!(
            !body.contains("/tmp/x.log"),
            "the server's paths stay: {body}"
        );
        let imported = parse(&body).unwrap();
        assert_eq!(imported.title.as_deref(), Some("Fix it"));
        assert_eq!(imported.model.as_deref(), Some("p/m"));
        let messages: Vec<Value> = imported
            .messages
            .iter()
            .map(|m| serde_json::from_str(m.get()).unwrap())
            .collect();
        assert_eq!(messages, [json!({"role": "user", "content": "hi"})]);
        let new: Vec<NewEvent> = imported.new_events("new").collect();
        assert_eq!(new.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
        let params: Value = serde_json::from_str(&new[1].params_json).unwrap();
        assert_eq!(
            params,
            json!({"session_id": "new", "seq": 2, "turn_id": "t"})
        );
        // The task gets a new id, and the events name it by that one.
        let tasks = imported.new_tasks("new", |id| format!("/data/tasks/{id}.log"));
        let new_id = tasks[0].task_id.clone();
        assert_ne!(new_id, "task-1");
        let params: Value = serde_json::from_str(&new[2].params_json).unwrap();
        assert_eq!(params["task_id"], new_id.as_str());
        assert_eq!(
            (tasks[0].session_id.as_str(), tasks[0].tool_call_id.as_str()),
            ("new", "call-1")
        );
        assert_eq!(tasks[0].output_path, format!("/data/tasks/{new_id}.log"));
        // It was running when exported: nothing runs it here.
        assert_eq!(tasks[0].state, TaskState::Failed);
        assert!(tasks[0].finished_at.is_some());
        let twice = format!("{body}{}\n", body.lines().last().unwrap());
        assert!(parse(&twice).unwrap_err().to_string().contains("twice"));
        assert!(parse("").is_err());
        assert!(
            parse("{\"type\":\"event\"}")
                .unwrap_err()
                .to_string()
                .contains("header")
        );
        let bad = format!(
            "{}{{\"type\":\"what\"}}\n",
            body.lines().next().unwrap().to_owned() + "\n"
        );
        assert!(parse(&bad).unwrap_err().to_string().contains("line 2"));
    }

    fn header_line() -> String {
        json!({"type": "session", "version": FORMAT_VERSION, "session_id": "s", "cwd": ""})
            .to_string()
            + "\n"
    }

    #[test]
    fn negative_and_future_cost_rows_are_refused() {
        let row = |usd: f64, at: &str| {
            let mut line = json!({
                "type": "cost", "session_id": "s", "node_id": "agent", "model": "m",
                "reserved_usd": 0.0, "actual_usd": usd, "tokens_in": 1, "tokens_out": 1,
                "committed": true, "turn_id": null, "task_id": null, "created_at": at,
            });
            line["type"] = json!("cost");
            format!("{}{line}\n", header_line())
        };
        assert!(parse(&row(0.01, "2026-01-01T00:00:00Z")).is_ok());
        let err = parse(&row(-1000.0, "2026-01-01T00:00:00Z")).unwrap_err();
        assert!(
            err.to_string().contains("line 2: a cost row's USD"),
            "{err}"
        );
        let err = parse(&row(0.01, "2099-01-01T00:00:00Z")).unwrap_err();
        assert!(err.to_string().contains("future"), "{err}");
    }

    #[tokio::test]
    async fn an_endless_line_is_refused_once_it_passes_its_limit() {
        // A header, then a line that never ends: the reader holds at most the limit of it.
        let endless = tokio::io::AsyncReadExt::chain(
            std::io::Cursor::new(header_line().into_bytes()),
            tokio::io::repeat(b'x'),
        );
        let err = read(tokio::io::BufReader::new(endless)).await.unwrap_err();
        assert!(
            matches!(err, ExportFormatError::LineTooLong { line: 2, .. }),
            "{err}"
        );
    }
}
