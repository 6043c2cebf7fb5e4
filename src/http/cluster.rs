//! `POST /cluster/call`: a request another node forwarded for a session this node owns
//! (cluster mode), authenticated by the cluster secret rather than a user's token.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;
use super::auth::same_secret;
use crate::session::Caller;
use crate::session::forwarding::Forwarded;

/// Runs the forwarded call: `{"ok": answer}`, or `{"error": {kind, message}}` as the actor
/// refused it; 409 `not_owner` when this node does not own the session; 401 without the
/// secret; 404 when cluster mode is off (to a caller that presents one).
pub async fn call(
    State(app): State<AppState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let cluster = &app.config().cluster;
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    // A caller that presents no secret learns nothing, not even whether cluster mode is on.
    let Some(presented) = presented else {
        return unauthorized();
    };
    if !cluster.enabled {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"error": {"kind": "not_found", "message": "cluster mode is off"}})),
        )
            .into_response();
    }
    if !same_secret(presented, cluster.secret.expose()) {
        return unauthorized();
    }
    let mut forwarded: Forwarded = match serde_json::from_slice(&body) {
        Ok(forwarded) => forwarded,
        Err(err) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(json!({"error": {"kind": "bad_request", "message": err.to_string()}})),
            )
                .into_response();
        }
    };
    // The forwarding node's span is the parent of what the call starts here.
    if let Some(traceparent) = headers
        .get("traceparent")
        .and_then(|value| value.to_str().ok())
    {
        forwarded.call.continue_trace(traceparent.to_string());
    }
    let caller = Caller {
        user: forwarded.user,
    };
    let outcome = app
        .sessions()
        .serve_forwarded(&caller, &forwarded.session_id, forwarded.call)
        .await;
    // The asking node waits until its watchers have every event up to here before it answers
    // its client, so the answer follows the events it caused, as on one node.
    let seq = match app
        .sessions()
        .store()
        .get_session(&forwarded.session_id)
        .await
    {
        Ok(Some(row)) => row.last_seq,
        _ => 0,
    };
    match outcome {
        Ok(Some(answer)) => Json(json!({"ok": answer, "seq": seq})).into_response(),
        Ok(None) => (StatusCode::CONFLICT, Json(json!({"error": {"kind": "not_owner", "message": "this node does not own the session"}}))).into_response(),
        Err(err) => Json(json!({"error": {"kind": err.kind(), "message": err.to_string()}, "seq": seq})).into_response(),
    }
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        Json(json!({"error": {"kind": "unauthorized", "message": "the cluster secret is missing or wrong"}})),
    )
        .into_response()
}
