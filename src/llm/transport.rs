//! The HTTP side every adapter shares: one streamed POST with retries, status mapping and
//! server-sent-event reading, around an adapter's own [`Decoder`] of the events.
//!
//! Failures map onto [`LlmError`]: 429, 5xx, 408 and transport errors are retried with
//! exponential backoff (or the server's `Retry-After`) as long as no byte of the answer has been
//! read; 401/403 are `Unauthorized`; any answer that says the context is too long is
//! `ContextOverflow`; a stream that is cut off or malformed is `BadResponse`. Cancellation wins
//! at every await point.

use std::time::{Duration, SystemTime};

use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::openai::OpenAiOptions;
use super::openai::sse::{SseEvent, SseParser};
use super::openai::wire::{error_message, is_context_overflow};
use super::{ChatResponse, Delta, LlmError};
use crate::secret::Secret;

/// How much of an error body is read; the rest is not worth the wait.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// What one event meant for the caller.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Fragments to forward.
    Emit(Vec<Delta>),
    /// Nothing to forward.
    Continue,
    /// The stream's own end marker.
    Done,
}

/// An adapter's reading of its API's event stream into one answer.
pub(crate) trait Decoder: Default + Send {
    /// What was missing when a stream ends without the model finishing, for the error.
    const MISSING_END: &'static str;
    /// Applies one event.
    fn apply(&mut self, event: &SseEvent) -> Result<Step, LlmError>;
    /// Whether any text, reasoning or tool-call fragment has arrived.
    fn has_output(&self) -> bool;
    /// Whether the model said it was done: a stream cut after this still stands.
    fn saw_end(&self) -> bool;
    /// The finished answer.
    fn finish(&mut self) -> Result<ChatResponse, LlmError>;
}

/// How the key is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Auth {
    /// `Authorization: Bearer KEY`.
    Bearer,
    /// The key as the whole value of this header (`x-api-key`).
    Header(&'static str),
}

/// One endpoint, its credentials and its retry policy.
pub(crate) struct Transport {
    client: reqwest::Client,
    url: Url,
    api_key: Option<Secret>,
    auth: Auth,
    headers: HeaderMap,
    options: OpenAiOptions,
}

impl Transport {
    /// A transport posting to `url`, with `headers` on every request.
    pub(crate) fn new(
        url: Url,
        api_key: Option<Secret>,
        auth: Auth,
        headers: &[(&'static str, &str)],
        options: OpenAiOptions,
    ) -> Result<Self, LlmError> {
        let api_key = api_key.filter(|key| !key.expose().is_empty());
        if let Some(key) = &api_key
            && HeaderValue::from_str(&format!("Bearer {}", key.expose())).is_err()
        {
            return Err(LlmError::Unauthorized(
                "the API key contains characters that cannot be sent in an HTTP header".into(),
            ));
        }
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            let value = HeaderValue::from_str(value).map_err(|_| {
                LlmError::Unavailable(format!("the {name} header value cannot be sent"))
            })?;
            map.insert(HeaderName::from_static(name), value);
        }
        let client = reqwest::Client::builder()
            .connect_timeout(options.connect_timeout)
            .timeout(options.request_timeout)
            .build()
            .map_err(|err| LlmError::Unavailable(format!("cannot build the HTTP client: {err}")))?;
        Ok(Self {
            client,
            url,
            api_key,
            auth,
            headers: map,
            options,
        })
    }

    /// The URL requests go to.
    pub(crate) fn url(&self) -> &Url {
        &self.url
    }

    /// The options in force.
    pub(crate) fn options(&self) -> &OpenAiOptions {
        &self.options
    }

    /// Whether a key is sent.
    pub(crate) fn has_key(&self) -> bool {
        self.api_key.is_some()
    }

    /// Posts `body` and reads the answer with `D`, retrying while nothing has been read.
    pub(crate) async fn stream<D: Decoder>(
        &self,
        body: &[u8],
        model: &str,
        deltas: &mpsc::Sender<Delta>,
        cancel: &CancellationToken,
    ) -> Result<ChatResponse, LlmError> {
        let mut retry = 0;
        loop {
            let outcome = tokio::select! {
                biased;
                _ = cancel.cancelled() => return Err(LlmError::Cancelled),
                outcome = self.attempt::<D>(body, deltas) => outcome,
            };
            let (error, retry_after) = match outcome {
                Ok(answer) => return Ok(answer),
                Err(Failure::Final(error)) => {
                    tracing::warn!(
                        url = %self.shown_url(),
                        model,
                        kind = error.kind().as_str(),
                        error = %error,
                        "model call failed"
                    );
                    return Err(error);
                }
                Err(Failure::Retry { error, retry_after }) => (error, retry_after),
            };
            if retry >= self.options.max_retries {
                tracing::warn!(
                    url = %self.shown_url(),
                    model,
                    kind = error.kind().as_str(),
                    attempts = retry + 1,
                    error = %error,
                    "model call failed"
                );
                return Err(error);
            }
            let delay = match retry_after {
                Some(wait) => wait.min(self.options.retry_after_cap),
                None => self.backoff(retry),
            };
            tracing::warn!(
                url = %self.shown_url(),
                retry = retry + 1,
                delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                error = %error,
                "model call failed; retrying"
            );
            retry += 1;
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return Err(LlmError::Cancelled),
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// The delay before retry number `retry` (0-based) when the server named none.
    pub(crate) fn backoff(&self, retry: u32) -> Duration {
        let factor = 2u32.saturating_pow(retry.min(16));
        let delay = self
            .options
            .backoff_base
            .saturating_mul(factor)
            .min(self.options.backoff_cap);
        // Spread concurrent sessions that hit the same limit: 75 % to 125 % of the delay.
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|elapsed| elapsed.subsec_nanos())
            .unwrap_or(0);
        let spread = 0.75 + f64::from(nanos % 1000) / 2000.0;
        delay.mul_f64(spread).min(self.options.backoff_cap)
    }

    /// One HTTP attempt: send, check the status, read the stream.
    async fn attempt<D: Decoder>(
        &self,
        body: &[u8],
        deltas: &mpsc::Sender<Delta>,
    ) -> Result<ChatResponse, Failure> {
        let sent = std::time::Instant::now();
        let mut builder = self
            .client
            .post(self.url.clone())
            .headers(self.headers.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "text/event-stream")
            .body(body.to_vec());
        // The provider (or a gateway before it) continues the turn's trace.
        if let Some(traceparent) = crate::telemetry::current_traceparent() {
            builder = builder.header("traceparent", traceparent);
        }
        if let Some(key) = &self.api_key {
            builder = match self.auth {
                Auth::Bearer => builder.bearer_auth(key.expose()),
                Auth::Header(name) => builder.header(name, key.expose()),
            };
        }
        let response = builder.send().await.map_err(|err| Failure::Retry {
            // A refused or unresolvable connection is an operator's to fix: name where to.
            error: LlmError::Unavailable(self.redact(&format!(
                "{}: {}",
                self.shown_url(),
                transport_error(err, &self.options)
            ))),
            retry_after: None,
        })?;
        let status = response.status();
        if !status.is_success() {
            return Err(self.status_failure(response).await);
        }
        let is_json = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.starts_with("application/json"));
        if is_json {
            let text = read_capped(response, MAX_ERROR_BODY).await;
            let message = error_message(&text);
            if is_context_overflow(&message) {
                return Err(Failure::Final(LlmError::ContextOverflow(
                    self.redact(&message),
                )));
            }
            return Err(Failure::Final(LlmError::BadResponse(self.redact(
                &format!(
                    "the endpoint answered a JSON document instead of an event stream: {message}"
                ),
            ))));
        }
        self.read_stream::<D>(response, deltas, sent).await
    }

    /// Turns a non-2xx answer into a retryable or final failure.
    async fn status_failure(&self, response: reqwest::Response) -> Failure {
        let status = response.status();
        let retry_after = parse_retry_after(response.headers());
        let text = read_capped(response, MAX_ERROR_BODY).await;
        let message = error_message(&text);
        let detail = self.redact(&format!("HTTP {}: {message}", status.as_u16()));
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Failure::Final(LlmError::Unauthorized(detail));
        }
        // 529 is Anthropic's "overloaded".
        if status == StatusCode::TOO_MANY_REQUESTS || status.as_u16() == 529 {
            return Failure::Retry {
                error: LlmError::RateLimited(detail),
                retry_after,
            };
        }
        if is_context_overflow(&message) {
            return Failure::Final(LlmError::ContextOverflow(detail));
        }
        if status.is_server_error() || status == StatusCode::REQUEST_TIMEOUT {
            return Failure::Retry {
                error: LlmError::Unavailable(detail),
                retry_after,
            };
        }
        Failure::Final(LlmError::BadResponse(detail))
    }

    /// Reads the event stream to its end, forwarding fragments as they arrive.
    async fn read_stream<D: Decoder>(
        &self,
        mut response: reqwest::Response,
        deltas: &mpsc::Sender<Delta>,
        sent: std::time::Instant,
    ) -> Result<ChatResponse, Failure> {
        let mut parser = SseParser::default();
        let mut answer = D::default();
        let mut received_any = false;
        let mut first_token = None;
        fn finish<D: Decoder>(
            answer: &mut D,
            first_token: Option<Duration>,
        ) -> Result<ChatResponse, Failure> {
            let mut done = answer.finish().map_err(Failure::Final)?;
            done.first_token = first_token;
            Ok(done)
        }
        loop {
            let chunk = match response.chunk().await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => break,
                Err(err) => {
                    let timed_out = err.is_timeout();
                    let text = self.redact(&transport_error(err, &self.options));
                    if !received_any {
                        return Err(Failure::Retry {
                            error: LlmError::Unavailable(text),
                            retry_after: None,
                        });
                    }
                    if answer.saw_end() {
                        // Everything but the trailing usage arrived; the answer stands.
                        break;
                    }
                    let error = if timed_out {
                        LlmError::Unavailable(text)
                    } else {
                        LlmError::BadResponse(format!("the stream broke off: {text}"))
                    };
                    return Err(Failure::Final(error));
                }
            };
            received_any |= !chunk.is_empty();
            let events = parser.push(&chunk).map_err(|why| {
                Failure::Final(LlmError::BadResponse(format!(
                    "malformed event stream: {why}"
                )))
            })?;
            for event in events {
                let step = answer.apply(&event).map_err(|err| {
                    Failure::Final(match err {
                        LlmError::BadResponse(text) => LlmError::BadResponse(self.redact(&text)),
                        LlmError::ContextOverflow(text) => {
                            LlmError::ContextOverflow(self.redact(&text))
                        }
                        other => other,
                    })
                })?;
                if first_token.is_none() && answer.has_output() {
                    first_token = Some(sent.elapsed());
                }
                match step {
                    Step::Emit(fragments) => {
                        for fragment in fragments {
                            // A dropped receiver only means nobody watches; the answer counts.
                            let _ = deltas.send(fragment).await;
                        }
                    }
                    Step::Continue => {}
                    Step::Done => return finish(&mut answer, first_token),
                }
            }
        }
        if answer.saw_end() {
            return finish(&mut answer, first_token);
        }
        Err(Failure::Final(LlmError::BadResponse(format!(
            "the stream ended before the model finished ({})",
            D::MISSING_END
        ))))
    }

    /// The URL as logs may show it: without a password it may carry.
    pub(crate) fn shown_url(&self) -> String {
        let mut url = self.url.clone();
        let _ = url.set_password(None);
        url.to_string()
    }

    /// `text` with the API key blanked out, should a server ever echo it.
    pub(crate) fn redact(&self, text: &str) -> String {
        match &self.api_key {
            Some(key) if text.contains(key.expose()) => {
                text.replace(key.expose(), crate::secret::REDACTED)
            }
            _ => text.to_string(),
        }
    }
}

/// How one attempt failed.
enum Failure {
    /// Worth another attempt; `error` is the answer once the retries are spent.
    Retry {
        error: LlmError,
        retry_after: Option<Duration>,
    },
    /// No retry can help.
    Final(LlmError),
}

/// `path` (such as `chat/completions`) under `base_url`, which may already end with it.
pub(crate) fn endpoint_url(base_url: &str, path: &[&str]) -> Result<Url, LlmError> {
    let mut url = Url::parse(base_url).map_err(|err| {
        LlmError::Unavailable(format!("the configured base_url is not a valid URL: {err}"))
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(LlmError::Unavailable(
            "the configured base_url must be an http:// or https:// URL".into(),
        ));
    }
    let suffix = format!("/{}", path.join("/"));
    if url.path().trim_end_matches('/').ends_with(&suffix) {
        return Ok(url);
    }
    url.path_segments_mut()
        .map_err(|()| LlmError::Unavailable("the configured base_url cannot have a path".into()))?
        .pop_if_empty()
        .extend(path);
    Ok(url)
}

/// `Retry-After` in seconds (integer or decimal) or as an HTTP date (a date passed means now);
/// at most a day.
pub(crate) fn parse_retry_after(headers: &HeaderMap) -> Option<Duration> {
    const DAY: Duration = Duration::from_secs(86_400);
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<f64>() {
        return (seconds.is_finite() && seconds >= 0.0)
            .then(|| Duration::from_secs_f64(seconds.min(DAY.as_secs_f64())));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    let wait = at
        .duration_since(std::time::SystemTime::now())
        .unwrap_or(Duration::ZERO);
    Some(wait.min(DAY))
}

/// Up to `limit` bytes of a body as text; a broken body reads as what arrived.
async fn read_capped(response: reqwest::Response, limit: usize) -> String {
    let prefix = crate::capped_read::response_prefix(response, limit).await;
    String::from_utf8_lossy(&prefix.bytes).into_owned()
}

/// A transport error and its causes on one line, without the URL.
fn transport_error(err: reqwest::Error, options: &OpenAiOptions) -> String {
    let err = err.without_url();
    if err.is_timeout() {
        return format!(
            "the request timed out (limits: {} s to connect, {} s in total)",
            options.connect_timeout.as_secs_f64(),
            options.request_timeout.as_secs_f64()
        );
    }
    let mut text = err.to_string();
    let mut current = std::error::Error::source(&err);
    while let Some(cause) = current {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        current = cause.source();
    }
    text
}
