//! update_plan and request_user_input: the model's plan, and questions it puts to the user.

use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::parse_args;
use crate::tools::{Effects, Tool, ToolContext, ToolError, ToolEvent, ToolMeta, ToolResult};

/// How long `request_user_input` waits for an answer by default.
pub const DEFAULT_ANSWER_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// Where one plan step stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    /// Not started.
    Pending,
    /// Being worked on; at most one step at a time.
    InProgress,
    /// Done.
    Completed,
}

/// One step of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanStep {
    /// What the step is.
    pub step: String,
    /// Where it stands.
    pub status: StepStatus,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanArgs {
    explanation: Option<String>,
    plan: Vec<PlanStep>,
}

/// Publishes the model's step-by-step plan to the client.
#[derive(Debug, Default)]
pub struct UpdatePlan;

#[async_trait]
impl Tool for UpdatePlan {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "update_plan",
                "Record your plan for the task as a list of short steps, each pending, in_progress \
                 or completed. At most one step may be in_progress. Call it again whenever a step \
                 starts or finishes; the user sees the plan live.",
                json!({
                    "type": "object",
                    "properties": {
                        "explanation": {"type": "string", "description": "Optional note on why the plan changed."},
                        "plan": {
                            "type": "array",
                            "description": "The whole plan, in order.",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "step": {"type": "string", "description": "What the step does, in a few words."},
                                    "status": {"type": "string", "enum": ["pending", "in_progress", "completed"], "description": "Where the step stands."}
                                },
                                "required": ["step", "status"],
                                "additionalProperties": false
                            }
                        }
                    },
                    "required": ["plan"],
                    "additionalProperties": false
                }),
Effects::NONE,
            )
            .contract()
            .tags(&["plan"])
            .exclusive()
        });
        &META
    }

    async fn call(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        let args: PlanArgs = parse_args(&self.meta().name, args)?;
        let in_progress = args
            .plan
            .iter()
            .filter(|s| s.status == StepStatus::InProgress)
            .count();
        if in_progress > 1 {
            return Err(ToolError::model(
                "invalid_input",
                format!("{in_progress} steps are in_progress; mark at most one"),
            ));
        }
        let plan = serde_json::to_value(&args.plan)
            .map_err(|err| ToolError::Fatal(format!("plan does not serialise: {err}")))?;
        ctx.emit(ToolEvent::PlanUpdated {
            explanation: args.explanation.clone(),
            plan: plan.clone(),
        })
        .await;
        let done = args
            .plan
            .iter()
            .filter(|s| s.status == StepStatus::Completed)
            .count();
        Ok(ToolResult::ok(format!(
            "plan updated: {done} of {} steps completed",
            args.plan.len()
        ))
        .with_metadata(json!({"explanation": args.explanation, "plan": plan})))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QuestionArgs {
    questions: Vec<Question>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct Question {
    id: String,
    header: String,
    question: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    options: Vec<QuestionOption>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct QuestionOption {
    label: String,
    description: String,
}

/// Asks the user questions and waits for the answers.
#[derive(Debug)]
pub struct RequestUserInput {
    timeout: Duration,
}

impl Default for RequestUserInput {
    fn default() -> Self {
        Self::new(DEFAULT_ANSWER_TIMEOUT)
    }
}

impl RequestUserInput {
    /// A request_user_input that gives up after `timeout`.
    pub fn new(timeout: Duration) -> Self {
        Self { timeout }
    }
}

#[async_trait]
impl Tool for RequestUserInput {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "request_user_input",
                "Ask the user one or more questions and wait for their answers. Use it only when \
                 you cannot proceed without a decision or information only the user has. Offer \
                 options when the choices are known.",
                json!({
                    "type": "object",
                    "properties": {
                        "questions": {
                            "type": "array",
                            "minItems": 1,
                            "description": "The questions to ask, in order.",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "id": {"type": "string", "description": "Identifier the answer is keyed by."},
                                    "header": {"type": "string", "description": "A short title for the question."},
                                    "question": {"type": "string", "description": "The question itself."},
                                    "options": {
                                        "type": "array",
                                        "description": "Choices to offer, if the answer is one of a known set.",
                                        "items": {
                                            "type": "object",
                                            "properties": {
                                                "label": {"type": "string", "description": "The choice as shown."},
                                                "description": {"type": "string", "description": "What choosing it means."}
                                            },
                                            "required": ["label", "description"],
                                            "additionalProperties": false
                                        }
                                    }
                                },
                                "required": ["id", "header", "question"],
                                "additionalProperties": false
                            }
                        }
                    },
                    "required": ["questions"],
                    "additionalProperties": false
                }),
Effects::NONE,
            )
            .groups(&["delegated"])
            .contract()
            .tags(&["plan"])
            .exclusive()
        });
        &META
    }

    async fn call(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        let args: QuestionArgs = parse_args(&self.meta().name, args)?;
        if args.questions.is_empty() {
            return Err(ToolError::model(
                "invalid_input",
                "ask at least one question",
            ));
        }
        let questions = serde_json::to_value(&args.questions)
            .map_err(|err| ToolError::Fatal(format!("questions do not serialise: {err}")))?;
        let request_id = uuid::Uuid::new_v4().to_string();
        let (reply, answer) = oneshot::channel();
        let delivered = ctx
            .emit(ToolEvent::UserInputRequested {
                request_id: request_id.clone(),
                questions,
                reply,
            })
            .await;
        if !delivered {
            return Err(ToolError::model(
                "no_user",
                "nobody can answer: no client is attached to this session; decide yourself or \
                 say what you need in your reply",
            ));
        }
        let answers = tokio::select! {
            // An interruption wins over an answer channel closed by the same shutdown.
            biased;
            () = ctx.cancel.cancelled() => {
                return Err(ToolError::model("cancelled", "the question was withdrawn: the turn was interrupted"));
            }
            outcome = tokio::time::timeout(self.timeout, answer) => outcome,
        };
        match answers {
            Ok(Ok(answers)) => Ok(ToolResult::ok(answers.to_string())
                .with_metadata(json!({"request_id": request_id, "answers": answers}))),
            Ok(Err(_)) => Err(ToolError::model(
                "no_user",
                "nobody answered: the session closed before the user replied",
            )),
            Err(_) => Err(ToolError::model(
                "timeout",
                format!(
                    "nobody answered within {} seconds; decide yourself or ask again later",
                    self.timeout.as_secs()
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    fn listening() -> (ToolContext, mpsc::Receiver<ToolEvent>) {
        let (tx, rx) = mpsc::channel(4);
        let ctx = ToolContext {
            events: Some(tx),
            ..ToolContext::detached(".")
        };
        (ctx, rx)
    }

    #[tokio::test]
    async fn update_plan_emits_the_plan_and_returns_it() {
        let (ctx, mut rx) = listening();
        let args = json!({"explanation": "start", "plan": [
            {"step": "read", "status": "completed"},
            {"step": "write", "status": "in_progress"},
            {"step": "test", "status": "pending"}
        ]});
        let result = UpdatePlan.call(&ctx, &args).await.unwrap();
        assert_eq!(result.output, "plan updated: 1 of 3 steps completed");
        assert_eq!(
            result.structured_metadata.as_ref().unwrap()["plan"],
            args["plan"]
        );
        match rx.recv().await {
            Some(ToolEvent::PlanUpdated { explanation, plan }) => {
                assert_eq!(explanation.as_deref(), Some("start"));
                assert_eq!(plan, args["plan"]);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[tokio::test]
    async fn update_plan_allows_one_step_in_progress() {
        let args = json!({"plan": [
            {"step": "a", "status": "in_progress"},
            {"step": "b", "status": "in_progress"}
        ]});
        let err = UpdatePlan
            .call(&ToolContext::detached("."), &args)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("at most one"), "{err}");
        let bad = json!({"plan": [{"step": "a", "status": "done"}]});
        assert!(
            UpdatePlan
                .call(&ToolContext::detached("."), &bad)
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn request_user_input_waits_for_the_answer() {
        let (ctx, mut rx) = listening();
        let args = json!({"questions": [{"id": "db", "header": "Database", "question": "Which one?",
            "options": [{"label": "sqlite", "description": "embedded"}]}]});
        let tool = RequestUserInput::default();
        let answer = async {
            match rx.recv().await {
                Some(ToolEvent::UserInputRequested {
                    questions,
                    reply,
                    request_id,
                }) => {
                    assert_eq!(questions[0]["options"][0]["label"], "sqlite");
                    assert!(!request_id.is_empty());
                    reply.send(json!({"db": "sqlite"})).unwrap();
                }
                other => panic!("unexpected {other:?}"),
            }
        };
        let (result, ()) = tokio::join!(tool.call(&ctx, &args), answer);
        let result = result.unwrap();
        assert_eq!(result.output, r#"{"db":"sqlite"}"#);
    }

    #[tokio::test]
    async fn request_user_input_without_a_client_or_answer_fails_clearly() {
        let args = json!({"questions": [{"id": "q", "header": "h", "question": "?"}]});
        let err = RequestUserInput::default()
            .call(&ToolContext::detached("."), &args)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                ToolError::Model {
                    kind: "no_user",
                    ..
                }
            ),
            "{err}"
        );

        // The client holds the request but never answers.
        let (ctx, mut rx) = listening();
        let tool = RequestUserInput::new(Duration::from_millis(20));
        let (release, held) = oneshot::channel::<()>();
        let holder = tokio::spawn(async move {
            let event = rx.recv().await;
            let _ = held.await;
            drop(event);
        });
        let err = tool.call(&ctx, &args).await.unwrap_err();
        assert!(
            matches!(
                err,
                ToolError::Model {
                    kind: "timeout",
                    ..
                }
            ),
            "{err}"
        );
        drop(release);
        holder.await.unwrap();

        // The client drops the request: the session closed.
        let (ctx, mut rx) = listening();
        let dropper = tokio::spawn(async move { drop(rx.recv().await) });
        let err = RequestUserInput::default()
            .call(&ctx, &args)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                ToolError::Model {
                    kind: "no_user",
                    ..
                }
            ),
            "{err}"
        );
        dropper.await.unwrap();

        let (ctx, mut rx) = listening();
        let cancel = ctx.cancel.clone();
        let drop_it = async move {
            let _event = rx.recv().await;
            cancel.cancel();
        };
        let tool = RequestUserInput::default();
        let (outcome, ()) = tokio::join!(tool.call(&ctx, &args), drop_it);
        assert!(matches!(
            outcome,
            Err(ToolError::Model {
                kind: "cancelled",
                ..
            })
        ));
    }
}
