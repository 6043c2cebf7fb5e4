//! `POST /api/sessions/{id}/turns`: a turn over REST, for callers without a WebSocket. The
//! turn starts and the answer is 202 `{turn_id}` at once, or, with `?wait=true`, 200 once the
//! turn has ended, with its final message, how it ended and what it cost.
//!
//! `multitask` says what happens when the session already runs a turn: `reject` (409
//! `turn_in_progress`, the default), `queue` (start once that turn has ended), `steer` (the
//! input joins that turn, as `turn/steer`; the answer names it) or `interrupt` (stop that
//! turn, then start). The route is outside the REST time limit: a waited turn
//! takes as long as it takes.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::AppState;
use super::error::{ApiError, ApiQuery};
use crate::session::frames::{FrameQueue, frame_queue};
use crate::session::{Caller, ModelChoice, Outbound, SessionError, Watcher};

/// Most times a turn is tried again after the running one was interrupted.
const INTERRUPT_TRIES: usize = 3;

/// What to do when a turn is already running.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Multitask {
    #[default]
    Reject,
    Queue,
    Steer,
    Interrupt,
}

/// The body: `turn/start`'s params without the session.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TurnBody {
    input: Value,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    reasoning_effort: Option<String>,
    #[serde(default)]
    turn_id: Option<String>,
    #[serde(default)]
    multitask: Multitask,
}

/// `?wait=true`.
#[derive(Deserialize)]
pub struct TurnQuery {
    #[serde(default)]
    wait: bool,
}

/// `POST /api/sessions/{id}/turns`.
pub async fn start_turn(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<TurnQuery>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    // It runs the model on the caller's account: a page of another site must not.
    super::auth::check_origin(&headers, &app.config().server.allowed_origins)?;
    let body: TurnBody = super::error::object_body(&body)?;
    let crate::session::TurnInput { text, images } =
        crate::session::TurnInput::from_json(body.input)
            .map_err(|refused| ApiError::BadRequest(refused.to_string()))?;
    let choice = ModelChoice {
        model: body.model,
        reasoning_effort: body.reasoning_effort,
    };
    choice.check(app.agent())?;
    let handle = app.sessions().handle(&caller, &id).await?;
    // Watching starts before the turn, so nothing of it is missed.
    let (tx, mut rx) = frame_queue(1024);
    let connection_id = app.next_connection_id();
    let watching = query.wait || body.multitask == Multitask::Queue;
    if watching {
        let watcher = Watcher {
            connection_id,
            tx,
            lagged: CancellationToken::new(),
        };
        handle.attach_replaying(watcher, None).await?;
    }
    let mut interrupts = 0;
    let mut after_end = false;
    let mut steered = false;
    let has_images = !images.is_empty();
    // The caller's trace context (W3C `traceparent`), which the turn's span continues.
    let traceparent = headers
        .get("traceparent")
        .and_then(|value| value.to_str().ok())
        .map(str::to_string);
    let started = loop {
        let (input, images, turn_id) = (text.clone(), images.clone(), body.turn_id.clone());
        let outcome = if after_end {
            // A turn's slot is free a moment after its end was told.
            handle
                .start_turn_after_end(input, images, turn_id, choice.clone(), traceparent.clone())
                .await
        } else {
            handle
                .start_turn_traced(input, images, turn_id, choice.clone(), traceparent.clone())
                .await
        };
        after_end = true;
        match (outcome, body.multitask) {
            (Err(SessionError::TurnInProgress), Multitask::Queue) => {
                if next_end(&mut rx, None).await.is_none() {
                    break Err(SessionError::ActorGone);
                }
            }
            (Err(SessionError::TurnInProgress), Multitask::Steer) => {
                if has_images {
                    break Err(SessionError::InvalidParams(
                        "multitask steer takes text only (as turn/steer); send images with a \
                         turn of their own"
                            .into(),
                    ));
                }
                // A turn that ends meanwhile is no longer there to steer: start anew.
                if let Some(running) = handle.describe().await?.running_turn
                    && handle.steer(running.clone(), text.clone()).await.is_ok()
                {
                    steered = true;
                    break Ok(running);
                }
            }
            (Err(SessionError::TurnInProgress), Multitask::Interrupt)
                if interrupts < INTERRUPT_TRIES =>
            {
                interrupts += 1;
                // Answered once the running turn has ended and said so.
                handle.interrupt().await?;
            }
            (outcome, _) => break outcome,
        }
    };
    let turn_id = match started {
        Ok(turn_id) => turn_id,
        Err(err) => {
            if watching {
                handle.detach(connection_id).await;
            }
            return Err(err.into());
        }
    };
    if !query.wait {
        if watching {
            handle.detach(connection_id).await;
        }
        let mut accepted = json!({"turn_id": turn_id});
        if steered {
            accepted["steered"] = json!(true);
        }
        return Ok((StatusCode::ACCEPTED, Json(accepted)).into_response());
    }
    let ended = next_end(&mut rx, Some(&turn_id)).await;
    handle.detach(connection_id).await;
    let Some((method, params, text)) = ended else {
        return Err(SessionError::ActorGone.into());
    };
    let mut answer = json!({
        "turn_id": turn_id,
        "steered": steered,
        "status": if method == "turn/completed" { "completed" } else { "failed" },
        "text": text,
    });
    for key in [
        "reason",
        "code",
        "message",
        "tokens_in",
        "tokens_out",
        "tokens_cached",
        "cost_usd",
    ] {
        if let Some(value) = params.get(key) {
            answer[key] = value.clone();
        }
    }
    Ok((StatusCode::OK, Json(answer)).into_response())
}

/// Reads the session's frames until a turn ends (`turn_id`'s, when given): its method, its
/// params and the last `message/completed` text before it; `None` once the session stopped.
async fn next_end(rx: &mut FrameQueue, turn_id: Option<&str>) -> Option<(String, Value, String)> {
    let mut text = String::new();
    while let Some(frame) = rx.recv().await {
        let Outbound::Text(frame) = frame else {
            return None;
        };
        let Ok(mut frame) = serde_json::from_str::<Value>(&frame) else {
            continue;
        };
        let method = frame["method"].as_str().unwrap_or_default().to_string();
        let params = frame["params"].take();
        let ours = turn_id.is_none_or(|id| params["turn_id"] == id);
        match method.as_str() {
            "message/completed" if ours => {
                text = params["text"].as_str().unwrap_or_default().to_string();
            }
            "turn/completed" | "turn/error" if ours => return Some((method, params, text)),
            _ => {}
        }
    }
    None
}
