//! Node-to-node requests: a follower passes a client's request for a session owned elsewhere
//! to the owner, `POST <advertise_url>/cluster/call` with the cluster secret, and the owner
//! answers as its own actor did.

use serde::Serialize;
use serde_json::{Value, json};

use super::Cluster;

/// The largest answer read from the node that owns a session.
const MAX_OWNER_ANSWER: usize = 64 * 1024 * 1024;

/// The path of the owner's endpoint.
pub const CALL_PATH: &str = "/cluster/call";

/// The owner's refusal: its `data.kind` and message.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// The kind.
    pub kind: String,
    /// The words.
    pub message: String,
}

/// Why a forwarded request got no answer from the owner.
#[derive(Debug)]
pub enum Undelivered {
    /// The owner could not be reached (it may have died); the lease will tell. Nothing ran.
    Unreachable(String),
    /// The owner took the request and was lost before answering: it may have run.
    Lost(String),
    /// The node no longer owns the session.
    NotOwner,
}

impl Cluster {
    /// Sends `call` (a session's forwarded request) to the owner at `url`; the owner's answer
    /// or refusal with the session's last event seq when it answered, or why there is none.
    pub async fn forward(
        &self,
        url: &str,
        session_id: &str,
        user: Option<&str>,
        call: &impl Serialize,
    ) -> Result<(Result<Value, Refusal>, i64), Undelivered> {
        self.metrics().cluster_forwarded.inc();
        let body = json!({"session_id": session_id, "user": user, "call": call});
        let mut request = self
            .http()
            .post(format!("{url}{CALL_PATH}"))
            .bearer_auth(self.secret().expose())
            .header("content-type", "application/json");
        if let Some(traceparent) = crate::telemetry::current_traceparent() {
            request = request.header("traceparent", traceparent);
        }
        let response = request.body(body.to_string()).send().await.map_err(|err| {
            if err.is_connect() {
                Undelivered::Unreachable(err.to_string())
            } else {
                Undelivered::Lost(err.to_string())
            }
        })?;
        let status = response.status();
        let bytes = crate::capped_read::response_body(response, MAX_OWNER_ANSWER)
            .await
            .map_err(|err| Undelivered::Lost(err.to_string()))?;
        if status == reqwest::StatusCode::CONFLICT {
            return Err(Undelivered::NotOwner);
        }
        let answer: Value = serde_json::from_slice(&bytes)
            .map_err(|_| Undelivered::Lost(format!("the owner answered {status} without JSON")))?;
        let seq = answer["seq"].as_i64().unwrap_or_default();
        if let Some(ok) = answer.get("ok") {
            return Ok((Ok(ok.clone()), seq));
        }
        let error = &answer["error"];
        let refused = Refusal {
            kind: error["kind"].as_str().unwrap_or("internal").to_string(),
            message: error["message"]
                .as_str()
                .unwrap_or("the owning node failed")
                .to_string(),
        };
        Ok((Err(refused), seq))
    }
}
