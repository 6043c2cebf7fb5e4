//! What wraps every route, from tower-http's layers: a request id (taken from `x-request-id` or
//! made, logged and returned), one span per request, its duration in the metrics, the security
//! headers on every response, panics answered as our 500, compression of JSON and text, and a
//! time limit on the REST routes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Version, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::compression::CompressionLayer;
use tower_http::compression::predicate::{DefaultPredicate, Predicate};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::set_header::SetResponseHeaderLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;
use tracing::Span;

use super::error::ApiError;
use crate::metrics::Metrics;

/// The header carrying a request's id, both ways.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// How long a REST route may take to answer (its body may stream for longer: a download).
pub const REST_TIMEOUT: Duration = Duration::from_secs(30);

/// What every response carries unless its route set its own (the AppUI sets a policy that lets
/// the page load its modules). JSON is never a page, so nothing of it may run or be framed.
const DEFAULT_CONTENT_SECURITY_POLICY: &str = "default-src 'none'; frame-ancestors 'none'";

/// `router` with the layers every route shares, the fallback included.
pub fn around_every_route<S>(router: Router<S>, metrics: Arc<Metrics>) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    router.layer(
        ServiceBuilder::new()
            .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
            .layer(
                TraceLayer::new_for_http()
                    .make_span_with(request_span)
                    .on_request(())
                    .on_response(log_response)
                    .on_failure(()),
            )
            .layer(PropagateRequestIdLayer::new(REQUEST_ID))
            .layer(middleware::from_fn_with_state(metrics, measure))
            .layer(SetResponseHeaderLayer::if_not_present(
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ))
            .layer(SetResponseHeaderLayer::if_not_present(
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            ))
            .layer(SetResponseHeaderLayer::if_not_present(
                header::X_FRAME_OPTIONS,
                HeaderValue::from_static("DENY"),
            ))
            .layer(SetResponseHeaderLayer::if_not_present(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(DEFAULT_CONTENT_SECURITY_POLICY),
            ))
            .layer(CompressionLayer::new().compress_when(DefaultPredicate::new().and(textual)))
            .layer(CatchPanicLayer::custom(panic_response)),
    )
}

/// `routes` answering 503 `timeout` when one takes longer than `limit` to answer.
pub fn with_timeout<S>(routes: Router<S>, limit: Duration) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    routes.layer(
        ServiceBuilder::new()
            .layer(middleware::map_response(move |response| {
                timeout_body(response, limit)
            }))
            .layer(TimeoutLayer::with_status_code(
                StatusCode::SERVICE_UNAVAILABLE,
                limit,
            )),
    )
}

/// One span per request: method, matched route and request id.
fn request_span(request: &Request<Body>) -> Span {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str);
    let id = request
        .headers()
        .get(&REQUEST_ID)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("");
    tracing::info_span!("request", method = %request.method(), route, request_id = id)
}

fn log_response(response: &Response<Body>, latency: Duration, _span: &Span) {
    tracing::info!(
        status = response.status().as_u16(),
        latency_ms = latency.as_secs_f64() * 1000.0,
        "request"
    );
}

/// Records the request's duration to its response's headers, by method, route and status.
async fn measure(State(metrics): State<Arc<Metrics>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    // A matched path is an `Arc<str>` inside: cloning it keeps the request path allocation-free.
    let route = request.extensions().get::<MatchedPath>().cloned();
    let response = next.run(request).await;
    metrics.record_http(
        method.as_str(),
        route.as_ref().map_or("unmatched", MatchedPath::as_str),
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

/// Worth compressing: JSON, text and the app's files, never an event stream (its events must
/// arrive as they are sent) or a download (already compressed, or meant byte for byte).
fn textual(_: StatusCode, _: Version, headers: &HeaderMap, _: &axum::http::Extensions) -> bool {
    let Some(kind) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
    else {
        return false;
    };
    let kind = kind.trim_start().to_ascii_lowercase();
    if kind.starts_with("text/event-stream") {
        return false;
    }
    [
        "application/json",
        "application/yaml",
        "application/openmetrics-text",
        "text/",
    ]
    .iter()
    .any(|prefix| kind.starts_with(prefix))
}

/// A handler that panicked answers our 500 shape; the panic is logged, not sent.
fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let detail = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("a handler panicked");
    ApiError::Internal(format!("panic: {detail}")).into_response()
}

/// The timeout layer's bare 503 as our error shape.
async fn timeout_body(response: Response, limit: Duration) -> Response {
    let bare = response.status() == StatusCode::SERVICE_UNAVAILABLE
        && !response.headers().contains_key(header::CONTENT_TYPE);
    if bare {
        return ApiError::Timeout(limit).into_response();
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tower::ServiceExt;

    async fn panicking() -> &'static str {
        panic!("the handler broke")
    }

    fn app(metrics: &Arc<Metrics>) -> Router {
        let slow = with_timeout(
            Router::new().route("/slow", get(std::future::pending::<&'static str>)),
            Duration::from_millis(20),
        );
        let routes = Router::new()
            .route("/panics", get(panicking))
            .route("/list", get(|| async { axum::Json(vec!["an item"; 100]) }))
            .route("/small", get(|| async { axum::Json("ok") }))
            .merge(slow);
        around_every_route(routes, Arc::clone(metrics))
    }

    async fn call(router: Router, path: &str, headers: &[(&str, &str)]) -> Response {
        let mut request = Request::get(path);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        router
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap()
    }

    async fn json(response: Response) -> serde_json::Value {
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn a_panic_is_our_500_with_every_header() {
        let metrics = Arc::new(Metrics::new());
        let response = call(app(&metrics), "/panics", &[]).await;
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let headers = response.headers().clone();
        assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert_eq!(headers[header::X_FRAME_OPTIONS], "DENY");
        assert_eq!(headers[header::REFERRER_POLICY], "no-referrer");
        assert_eq!(
            headers[header::CONTENT_SECURITY_POLICY],
            DEFAULT_CONTENT_SECURITY_POLICY
        );
        assert!(headers.contains_key(&REQUEST_ID));
        let body = json(response).await;
        assert_eq!(body["error"]["code"], "internal");
        assert!(
            !body.to_string().contains("the handler broke"),
            "the panic stays in the log: {body}"
        );
        assert!(metrics.render().contains(
            r#"agentd_http_request_duration_seconds_count{method="GET",route="/panics",status="500"} 1"#
        ));
    }

    #[tokio::test]
    async fn request_ids_are_made_or_kept_and_returned() {
        let metrics = Arc::new(Metrics::new());
        let made = call(app(&metrics), "/small", &[]).await;
        let id = made.headers()[&REQUEST_ID].to_str().unwrap().to_string();
        assert!(uuid::Uuid::parse_str(&id).is_ok(), "{id}");
        let other = call(app(&metrics), "/small", &[]).await;
        assert_ne!(other.headers()[&REQUEST_ID], id.as_str());
        let kept = call(app(&metrics), "/small", &[("x-request-id", "trace-7")]).await;
        assert_eq!(kept.headers()[&REQUEST_ID], "trace-7");
    }

    #[tokio::test]
    async fn json_lists_are_gzipped_when_asked_and_small_answers_are_not() {
        let metrics = Arc::new(Metrics::new());
        let gzip = [("accept-encoding", "gzip")];
        let list = call(app(&metrics), "/list", &gzip).await;
        assert_eq!(list.headers()[header::CONTENT_ENCODING], "gzip");
        let bytes = axum::body::to_bytes(list.into_body(), 1 << 20)
            .await
            .unwrap();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut text)
            .unwrap();
        let items: Vec<String> = serde_json::from_str(&text).unwrap();
        assert_eq!(items.len(), 100);
        let plain = call(app(&metrics), "/list", &[]).await;
        assert!(!plain.headers().contains_key(header::CONTENT_ENCODING));
        let small = call(app(&metrics), "/small", &gzip).await;
        assert!(!small.headers().contains_key(header::CONTENT_ENCODING));
    }

    #[test]
    fn event_streams_and_downloads_are_never_compressed() {
        let ok = |kind: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_TYPE, kind.parse().unwrap());
            textual(
                StatusCode::OK,
                Version::HTTP_11,
                &headers,
                &axum::http::Extensions::new(),
            )
        };
        assert!(ok("application/json"));
        assert!(ok("text/javascript; charset=utf-8"));
        assert!(ok(
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        ));
        assert!(!ok("text/event-stream"));
        assert!(!ok("application/octet-stream"));
        assert!(!textual(
            StatusCode::OK,
            Version::HTTP_11,
            &HeaderMap::new(),
            &axum::http::Extensions::new()
        ));
    }

    #[tokio::test]
    async fn a_route_past_its_time_limit_answers_503_timeout() {
        let metrics = Arc::new(Metrics::new());
        let response = call(app(&metrics), "/slow", &[]).await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(json(response).await["error"]["code"], "timeout");
    }
}
