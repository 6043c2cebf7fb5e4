//! `agentd exec`: one task run in-process, for scripts and CI — a session on the configured
//! store, one turn on the prompt, its events on stdout, an exit code that says how it ended.
//!
//! With `--json` every line of stdout is one JSON object: first `{"type": "session",
//! "session_id", "schema_version"}`, then each notification of the session as the WebSocket
//! sends it (`{"method", "params"}`), the turn's end last. Without it the model's text streams
//! to stdout and a one-line summary goes to stderr. `--output-schema` asks for a final answer
//! that validates against a JSON Schema, checks it, asks once more on a mismatch, and prints
//! the valid answer (and in `--json` mode, a last `{"type": "output", "value"}` line).

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::Server;
use crate::agent::approval::Decision;
use crate::agent::event::TurnCompletion;
use crate::error_kind::ErrorKind;
use crate::session::frames::{FrameQueue, frame_queue};
use crate::session::{Caller, ModelChoice, Outbound, SessionError, SessionHandle, Watcher};

/// The version of the `--json` line format; bumped when a line changes shape.
pub const SCHEMA_VERSION: u32 = 1;

/// The exit code of a turn that completed.
pub const EXIT_COMPLETED: u8 = 0;
/// The exit code of a turn that failed or ended without completing.
pub const EXIT_FAILED: u8 = 1;
/// The exit code of bad usage or configuration.
pub const EXIT_USAGE: u8 = 2;
/// The exit code of a turn stopped by its budget or by a policy or hook.
pub const EXIT_STOPPED: u8 = 3;

/// What `agentd exec` was asked.
#[derive(Debug, Clone, Default)]
pub struct ExecTask {
    /// The prompt.
    pub prompt: String,
    /// One JSON object per line on stdout.
    pub json: bool,
    /// The model of this task, `<provider>/<model>`.
    pub model: Option<String>,
    /// A JSON Schema the final answer must validate against.
    pub output_schema: Option<Value>,
    /// The session's directory, relative to the workspace.
    pub cwd: Option<String>,
    /// Calls that would ask for approval are accepted (`true`) or declined.
    pub approve_all: bool,
}

/// How a turn ended.
struct Ending {
    code: u8,
    final_text: String,
    summary: String,
}

/// Why `--output-schema`'s file is unusable.
#[derive(Debug, thiserror::Error)]
pub enum SchemaFileError {
    /// It cannot be read.
    #[error("--output-schema {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// It is not JSON.
    #[error("--output-schema {}: not JSON: {source}", path.display())]
    NotJson {
        /// The file.
        path: PathBuf,
        /// Where the JSON breaks.
        #[source]
        source: serde_json::Error,
    },
    /// It is JSON but no JSON Schema.
    #[error("--output-schema {}: not a JSON Schema: {reason}", path.display())]
    NotSchema {
        /// The file.
        path: PathBuf,
        /// What the schema compiler refused.
        reason: String,
    },
}

/// Why `agentd exec` could not run its turn to an end (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The session refused: an unknown model, a store that cannot write, a cwd outside.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The session's events stopped before its turn ended.
    #[error("the session stopped before the turn ended")]
    Stopped,
}

/// Why a final answer is not what `--output-schema` asks for.
#[derive(Debug, thiserror::Error)]
enum AnswerProblem {
    /// The answer is not JSON.
    #[error("it is not JSON ({0})")]
    NotJson(#[source] serde_json::Error),
    /// The schema does not compile (checked at start-up, so only if it changed meaning).
    #[error("{0}")]
    BadSchema(String),
    /// The JSON breaks the schema, at these places.
    #[error("{}", .0.join("; "))]
    Invalid(Vec<String>),
    /// The turn asked to correct the answer did not complete.
    #[error("the retry did not complete")]
    RetryIncomplete,
}

/// The largest `--output-schema` file read.
const MAX_SCHEMA_BYTES: u64 = 1024 * 1024;

/// Reads `--output-schema`'s file as a JSON Schema.
pub fn read_schema(path: &Path) -> Result<Value, SchemaFileError> {
    let text =
        crate::capped_read::read_file_to_string(path, MAX_SCHEMA_BYTES).map_err(|source| {
            SchemaFileError::Read {
                path: path.to_path_buf(),
                source,
            }
        })?;
    let schema: Value = serde_json::from_str(&text).map_err(|source| SchemaFileError::NotJson {
        path: path.to_path_buf(),
        source,
    })?;
    jsonschema::validator_for(&schema).map_err(|err| SchemaFileError::NotSchema {
        path: path.to_path_buf(),
        reason: err.to_string(),
    })?;
    Ok(schema)
}

impl Server {
    /// Runs `task` as one turn of a new session, writes its events to `out`, stops the server
    /// and answers the exit code.
    pub async fn exec(self, task: ExecTask, out: &mut (dyn Write + Send)) -> u8 {
        let code = match self.exec_turns(&task, out).await {
            Ok(code) => code,
            Err(message) => {
                let _ = writeln!(std::io::stderr(), "agentd exec: {message}");
                EXIT_USAGE
            }
        };
        self.stop().await;
        code
    }

    async fn exec_turns(
        &self,
        task: &ExecTask,
        out: &mut (dyn Write + Send),
    ) -> Result<u8, ExecError> {
        let sessions = self.state.sessions();
        let choice = ModelChoice {
            model: task.model.clone(),
            reasoning_effort: None,
        };
        if let Some(agent) = self.state.agent() {
            choice.check(Some(agent))?;
        }
        let caller = Caller { user: None };
        let (handle, row) = sessions.create(&caller, task.cwd.as_deref()).await?;
        let (tx, mut rx) = frame_queue(4096);
        let watcher = Watcher {
            connection_id: u64::MAX,
            tx,
            lagged: CancellationToken::new(),
        };
        handle.attach_replaying(watcher, None).await?;
        if task.json {
            line(
                out,
                &json!({"type": "session", "session_id": row.session_id, "schema_version": SCHEMA_VERSION}),
            );
        }
        let mut prompt = task.prompt.clone();
        if let Some(schema) = &task.output_schema {
            prompt.push_str(&format!(
                "\n\nWhen you are done, end with a final answer that is only a JSON value \
                 (no prose, no code fence) valid against this JSON Schema:\n{schema}"
            ));
        }
        let mut ending = self
            .exec_turn(&handle, &mut rx, prompt, &choice, task, out)
            .await?;
        if let (Some(schema), EXIT_COMPLETED) = (&task.output_schema, ending.code) {
            let mut problems = check_answer(schema, &ending.final_text);
            if let Err(problem) = &problems {
                // One more turn, told what was wrong; the schema applies to the final
                // answer only.
                let retry = format!(
                    "Your final answer does not validate against the JSON Schema: {problem}. \
                     Answer again with only the corrected JSON value."
                );
                ending = self
                    .exec_turn(&handle, &mut rx, retry, &choice, task, out)
                    .await?;
                problems = if ending.code == EXIT_COMPLETED {
                    check_answer(schema, &ending.final_text)
                } else {
                    Err(AnswerProblem::RetryIncomplete)
                };
            }
            match problems {
                Ok(value) => {
                    if task.json {
                        line(out, &json!({"type": "output", "value": value}));
                    } else {
                        let _ = writeln!(out, "{value}");
                    }
                }
                Err(problem) => {
                    let _ = writeln!(
                        std::io::stderr(),
                        "agentd exec: the final answer does not validate against --output-schema: {problem}"
                    );
                    ending.code = EXIT_FAILED;
                }
            }
        }
        let _ = out.flush();
        let _ = writeln!(std::io::stderr(), "{}", ending.summary);
        Ok(ending.code)
    }

    /// Starts one turn on `prompt` and follows the session's events to its end.
    async fn exec_turn(
        &self,
        handle: &SessionHandle,
        rx: &mut FrameQueue,
        prompt: String,
        choice: &ModelChoice,
        task: &ExecTask,
        out: &mut (dyn Write + Send),
    ) -> Result<Ending, ExecError> {
        // A retry follows the previous turn's end at once.
        let turn_id = handle
            .start_turn_after_end(prompt, Vec::new(), None, choice.clone(), None)
            .await?;
        let mut final_text = String::new();
        let streams = !task.json && task.output_schema.is_none();
        while let Some(frame) = rx.recv().await {
            let Outbound::Text(text) = frame else {
                continue;
            };
            let Ok(mut frame) = serde_json::from_str::<Value>(&text) else {
                continue;
            };
            let method = frame["method"].as_str().unwrap_or_default().to_string();
            let params = frame["params"].take();
            if task.json {
                line(out, &json!({"method": method, "params": params}));
            }
            match method.as_str() {
                "message/delta" if streams => {
                    let _ = write!(out, "{}", params["text"].as_str().unwrap_or_default());
                    let _ = out.flush();
                }
                "message/completed" => {
                    final_text = params["text"].as_str().unwrap_or_default().to_string();
                }
                "approval/requested" => {
                    let (decision, message) = if task.approve_all {
                        (Decision::Accept, None)
                    } else {
                        (
                            Decision::Decline,
                            Some("agentd exec declines calls that ask for approval; pass --approve all to run them".to_string()),
                        )
                    };
                    let approval_id = params["approval_id"].as_str().unwrap_or_default();
                    let _ = handle
                        .respond_approval(approval_id.to_string(), decision, message)
                        .await;
                }
                "turn/completed" | "turn/error" if params["turn_id"] == turn_id.as_str() => {
                    if streams && !final_text.is_empty() {
                        let _ = writeln!(out);
                    }
                    return Ok(ending_of(&method, &params, final_text));
                }
                _ => {}
            }
        }
        Err(ExecError::Stopped)
    }
}

/// The exit code and the summary line of a turn's end.
fn ending_of(method: &str, params: &Value, final_text: String) -> Ending {
    if method == "turn/completed" {
        let reason = params["reason"].as_str().unwrap_or_default();
        let summary = format!(
            "agentd exec: {reason}; {} tokens in, {} out, {} USD",
            params["tokens_in"], params["tokens_out"], params["cost_usd"]
        );
        let code = match TurnCompletion::of(params) {
            Some(TurnCompletion::Completed) => EXIT_COMPLETED,
            Some(TurnCompletion::BudgetRateExceeded) => EXIT_STOPPED,
            _ => EXIT_FAILED,
        };
        return Ending {
            code,
            final_text,
            summary,
        };
    }
    let code_name = params["code"].as_str().unwrap_or_default();
    let code = match ErrorKind::from_word(code_name) {
        Some(ErrorKind::BudgetExceeded | ErrorKind::HookBlocked | ErrorKind::PolicyDenied) => {
            EXIT_STOPPED
        }
        _ => EXIT_FAILED,
    };
    Ending {
        code,
        final_text,
        summary: format!(
            "agentd exec: turn failed ({code_name}): {}",
            params["message"].as_str().unwrap_or_default()
        ),
    }
}

/// The final answer as JSON valid against `schema`, or what is wrong with it.
fn check_answer(schema: &Value, text: &str) -> Result<Value, AnswerProblem> {
    let trimmed = text.trim();
    // A fenced answer is taken for its content: models add fences whatever they are told.
    let inner = trimmed
        .strip_prefix("```json")
        .or_else(|| trimmed.strip_prefix("```"))
        .and_then(|rest| rest.strip_suffix("```"))
        .unwrap_or(trimmed);
    let value: Value = serde_json::from_str(inner.trim()).map_err(AnswerProblem::NotJson)?;
    let validator = jsonschema::validator_for(schema)
        .map_err(|err| AnswerProblem::BadSchema(err.to_string()))?;
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .map(|err| format!("{} at {}", err, err.instance_path()))
        .collect();
    if errors.is_empty() {
        Ok(value)
    } else {
        Err(AnswerProblem::Invalid(errors))
    }
}

fn line(out: &mut (dyn Write + Send), value: &Value) {
    let _ = writeln!(out, "{value}");
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_checked_against_the_schema_fences_and_all() {
        let schema = json!({"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}});
        assert_eq!(
            check_answer(&schema, " {\"ok\": true} ").unwrap(),
            json!({"ok": true})
        );
        assert_eq!(
            check_answer(&schema, "```json\n{\"ok\": false}\n```").unwrap(),
            json!({"ok": false})
        );
        let invalid = check_answer(&schema, "{\"ok\": 1}").unwrap_err();
        assert!(
            matches!(&invalid, AnswerProblem::Invalid(places) if places.len() == 1),
            "{invalid:?}"
        );
        assert!(invalid.to_string().contains("ok"), "{invalid}");
        let not_json = check_answer(&schema, "done!").unwrap_err();
        assert!(
            matches!(not_json, AnswerProblem::NotJson(_)),
            "{not_json:?}"
        );
        assert!(not_json.to_string().contains("not JSON"), "{not_json}");
    }

    #[test]
    fn endings_map_to_exit_codes() {
        let ended = |method: &str, params: Value| ending_of(method, &params, String::new()).code;
        assert_eq!(ended("turn/completed", json!({"reason": "completed"})), 0);
        assert_eq!(
            ended("turn/completed", json!({"reason": "stuck_in_loop"})),
            1
        );
        assert_eq!(ended("turn/error", json!({"code": "llm_bad_response"})), 1);
        assert_eq!(ended("turn/error", json!({"code": "budget_exceeded"})), 3);
        assert_eq!(ended("turn/error", json!({"code": "hook_blocked"})), 3);
        // The rate cap ends the turn as completed, and is a budget's stop all the same.
        assert_eq!(
            ended("turn/completed", json!({"reason": "budget_rate_exceeded"})),
            3
        );
        assert_eq!(ended("turn/error", json!({"code": "no_such_code"})), 1);
    }
}
