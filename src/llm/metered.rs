//! A provider that times every model call it passes on: how long it took, how it ended and how
//! long its first fragment took, into the server's metrics.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::llm::{ChatRequest, ChatResponse, LlmError, Provider};
use crate::metrics::Metrics;

/// `inner`, with every call recorded in `metrics`; turns, compaction and the pipeline tool all
/// call the model through it.
pub struct MeteredProvider {
    inner: Arc<dyn Provider>,
    metrics: Arc<Metrics>,
}

impl MeteredProvider {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Provider>, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics }
    }
}

#[async_trait]
impl Provider for MeteredProvider {
    async fn stream_chat(
        &self,
        request: ChatRequest,
        deltas: mpsc::Sender<crate::llm::Delta>,
        cancel: CancellationToken,
    ) -> Result<ChatResponse, LlmError> {
        let started = Instant::now();
        let outcome = self.inner.stream_chat(request, deltas, cancel).await;
        let took = started.elapsed();
        match &outcome {
            Ok(answer) => self
                .metrics
                .record_model_call("ok", took, answer.first_token),
            Err(err) => self
                .metrics
                .record_model_call(err.kind().as_str(), took, None),
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Answers after `delay`, with a first fragment at `first`, or fails.
    struct Scripted {
        answer: Result<Option<Duration>, LlmError>,
    }

    #[async_trait]
    impl Provider for Scripted {
        async fn stream_chat(
            &self,
            _request: ChatRequest,
            _deltas: mpsc::Sender<crate::llm::Delta>,
            _cancel: CancellationToken,
        ) -> Result<ChatResponse, LlmError> {
            self.answer.clone().map(|first_token| ChatResponse {
                reasoning: None,
                text: "hi".into(),
                tool_calls: Vec::new(),
                usage: None,
                finish_reason: Some("stop".into()),
                first_token,
                model: None,
            })
        }
    }

    fn request() -> ChatRequest {
        ChatRequest {
            model: "m".into(),
            messages: Vec::new(),
            tools: Vec::new().into(),
            max_tokens: 16,
            reasoning_effort: None,
        }
    }

    #[tokio::test]
    async fn every_call_is_timed_by_outcome_and_first_fragments_are_recorded() {
        let metrics = Arc::new(Metrics::new());
        let call = |answer| {
            let provider = MeteredProvider::new(Arc::new(Scripted { answer }), metrics.clone());
            async move {
                let (deltas, _rx) = mpsc::channel(1);
                provider
                    .stream_chat(request(), deltas, CancellationToken::new())
                    .await
            }
        };
        call(Ok(Some(Duration::from_millis(120)))).await.unwrap();
        call(Ok(None)).await.unwrap();
        call(Err(LlmError::RateLimited("slow down".into())))
            .await
            .unwrap_err();
        let text = metrics.render();
        for line in [
            r#"agentd_model_call_duration_seconds_count{outcome="ok"} 2"#,
            r#"agentd_model_call_duration_seconds_count{outcome="llm_rate_limited"} 1"#,
            "agentd_model_time_to_first_token_seconds_count 1",
            "agentd_model_time_to_first_token_seconds_sum 0.12",
        ] {
            assert!(text.contains(line), "missing {line} in {text}");
        }
    }
}
