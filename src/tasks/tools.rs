//! The model's side of background tasks: `read_task_output` and `check_background_tasks`.

use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::query::{OutputParams, optional_mode_object};
use super::read::{TaskReadError, read_task_output, task_of_session};
use crate::store::Store;
use crate::tools::{Effects, Tool, ToolContext, ToolError, ToolMeta, ToolResult};

fn model_error(err: TaskReadError) -> ToolError {
    match err {
        TaskReadError::UnknownTask(id) => ToolError::model(
            "unknown_task",
            format!("unknown task {id}; check_background_tasks lists this session's tasks"),
        ),
        other => ToolError::model("unavailable", other.to_string()),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    task_handle: String,
    #[serde(default, deserialize_with = "optional_mode_object")]
    mode: Option<OutputParams>,
}

/// Reads a background task's output by its handle, in five modes.
pub struct ReadTaskOutput {
    store: Arc<dyn Store>,
}

impl ReadTaskOutput {
    /// What it is, known without a store.
    pub fn spec() -> &'static ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "read_task_output",
                "Read the output of a background task by its task_handle. Modes: head (first \
                 lines), tail (last lines), grep (lines containing a substring), line_range \
                 (1-based, inclusive) and bytes (a byte window, for paging with next_offset). Read \
                 only what you need; the answer says whether the task is complete.",
                json!({
                    "type": "object",
                    "properties": {
                        "task_handle": {"type": "string", "description": "The task_handle a background call returned."},
                        "mode": {
                            "type": "object",
                            "description": "What to read; head with 50 lines when omitted.",
                            "properties": {
                                "kind": {"type": "string", "enum": ["head", "tail", "grep", "line_range", "bytes"], "description": "The reading mode."},
                                "lines": {"type": "integer", "minimum": 1, "description": "head/tail: number of lines (default 50, at most 500)."},
                                "pattern": {"type": "string", "description": "grep: the substring to look for."},
                                "max_matches": {"type": "integer", "minimum": 1, "description": "grep: most matching lines (default 20, at most 100)."},
                                "start": {"type": "integer", "minimum": 1, "description": "line_range: first line, 1-based."},
                                "end": {"type": "integer", "minimum": 1, "description": "line_range: last line, inclusive."},
                                "offset": {"type": "integer", "minimum": 0, "description": "bytes: where to start."},
                                "limit_bytes": {"type": "integer", "minimum": 1, "description": "bytes: how much (default 65536, at most 1048576)."}
                            },
                            "required": ["kind"],
                            "additionalProperties": false
                        }
                    },
                    "required": ["task_handle"],
                    "additionalProperties": false
                }),
Effects::NONE,
            )
            .base()
            .contract()
            .tags(&["agents"])
        });
        &META
    }

    /// A read_task_output over the server's store.
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self { store }
    }
}

#[async_trait]
impl Tool for ReadTaskOutput {
    fn meta(&self) -> &ToolMeta {
        Self::spec()
    }

    async fn call(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        let args: ReadArgs = crate::tools::args::parse_args(&self.meta().name, args)?;
        let query = match args.mode {
            Some(mode) => mode
                .to_query()
                .map_err(|err| ToolError::model("invalid_input", err.to_string()))?,
            None => super::output::OutputQuery::default(),
        };
        let task = task_of_session(&self.store, &args.task_handle, &ctx.session_id)
            .await
            .map_err(model_error)?;
        let answer = read_task_output(&task, query).await.map_err(model_error)?;
        let mut text = format!(
            "[task {} {}; {} bytes in all{}{}]\n",
            task.task_id,
            answer["state"].as_str().unwrap_or_default(),
            answer["total_bytes"],
            if answer["truncated"] == true {
                "; truncated"
            } else {
                ""
            },
            match answer["next_offset"].as_u64() {
                Some(next) => format!("; next_offset={next}"),
                None => String::new(),
            }
        );
        text.push_str(answer["text"].as_str().unwrap_or_default());
        Ok(ToolResult::ok(text).with_metadata(answer))
    }
}

/// Lists this session's background tasks and their states.
pub struct CheckBackgroundTasks {
    store: Arc<dyn Store>,
}

/// The metas of the server's own tools, known without a store.
pub fn metas() -> [&'static ToolMeta; 2] {
    [ReadTaskOutput::spec(), CheckBackgroundTasks::spec()]
}

impl CheckBackgroundTasks {
    /// What it is, known without a store.
    pub fn spec() -> &'static ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "check_background_tasks",
                "List this session's background tasks: their handles, tools, states (running, \
                 completed, failed, cancelled), exit codes and output sizes.",
                json!({"type": "object", "properties": {}, "additionalProperties": false}),
                Effects::NONE,
            )
            .contract()
            .tags(&["agents"])
        });
        &META
    }

    /// A check_background_tasks over the server's store.
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self { store }
    }
}

#[async_trait]
impl Tool for CheckBackgroundTasks {
    fn meta(&self) -> &ToolMeta {
        Self::spec()
    }

    async fn call(&self, ctx: &ToolContext, _args: &Value) -> Result<ToolResult, ToolError> {
        let tasks = self
            .store
            .list_tasks(&ctx.session_id)
            .await
            .map_err(|err| ToolError::model("unavailable", format!("tasks unreadable: {err}")))?;
        let tasks: Vec<crate::store::TaskRow> =
            tasks.into_iter().map(super::read::with_live_size).collect();
        if tasks.is_empty() {
            return Ok(ToolResult::ok("no background tasks in this session")
                .with_metadata(json!({"tasks": []})));
        }
        let text: String = tasks
            .iter()
            .map(|t| {
                let exit = t
                    .exit_code
                    .map(|c| format!(", exit {c}"))
                    .unwrap_or_default();
                let reason = t
                    .reason
                    .as_deref()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default();
                format!(
                    "{} {} {}{exit}{reason}, {} bytes\n",
                    t.task_id, t.tool_name, t.state, t.total_bytes
                )
            })
            .collect();
        Ok(ToolResult::ok(text).with_metadata(json!({ "tasks": tasks })))
    }
}
