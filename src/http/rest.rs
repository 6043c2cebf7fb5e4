//! The JSON routes under `/api/`: sessions, their events, messages, tools, files, tasks and
//! cost, and the server's tool catalog. Another user's session or task is 404, exactly as if it
//! did not exist.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use super::error::{ApiError, ApiQuery};
use crate::fs_safe;
use crate::session::{Caller, SessionError};
use crate::store::{SessionPage, TaskRow, TaskState};
use crate::tasks::output::OutputParams;
use crate::tasks::read::{TaskReadError, read_task_output, with_live_size};

/// Most events one page returns.
const MAX_EVENTS_PAGE: i64 = 10_000;
/// Events per page when no limit is given.
const DEFAULT_EVENTS_PAGE: i64 = 1_000;

/// Most sessions one page returns.
const MAX_SESSIONS_PAGE: i64 = 1_000;
/// Sessions per page when no limit is given.
const DEFAULT_SESSIONS_PAGE: i64 = 100;

/// `GET /api/sessions`' query (`token` may ride beside it, for clients that cannot send a
/// header).
#[derive(Debug, Deserialize)]
pub struct SessionsQuery {
    /// Sessions per page, 1 to 1,000 (default 100).
    limit: Option<i64>,
    /// `next_cursor` of the page before.
    cursor: Option<String>,
}

/// `GET /api/sessions?limit=&cursor=`: the caller's sessions, newest first, a page at a time;
/// `next_cursor` names the next page, `null` after the last.
pub async fn list_sessions(
    State(app): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<SessionsQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_SESSIONS_PAGE);
    if !(1..=MAX_SESSIONS_PAGE).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "limit must be between 1 and {MAX_SESSIONS_PAGE}"
        )));
    }
    // An empty cursor is the first page, as none is.
    let after = query
        .cursor
        .as_deref()
        .filter(|cursor| !cursor.is_empty())
        .map(read_cursor)
        .transpose()?;
    // One row more than asked says whether another page follows.
    let mut rows = app
        .sessions()
        .store()
        .list_sessions(
            caller.user.as_deref(),
            &SessionPage {
                limit: limit + 1,
                after,
            },
        )
        .await?;
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let next_cursor = more
        .then(|| rows.last())
        .flatten()
        .map(|row| format!("{}_{}", super::rfc3339(row.updated_at), row.session_id));
    Ok(Json(
        json!({ "sessions": rows, "next_cursor": next_cursor }),
    ))
}

/// A `next_cursor`: the last row's `updated_at` and session id. Any other string names no
/// page, which is answered as a page that is not there (404).
fn read_cursor(cursor: &str) -> Result<(time::OffsetDateTime, String), ApiError> {
    let bad =
        || ApiError::NotFound("no page at this cursor: pass a next_cursor this server gave".into());
    let (at, id) = cursor.rsplit_once('_').ok_or_else(bad)?;
    let at = time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
        .map_err(|_| bad())?;
    if id.is_empty() {
        return Err(bad());
    }
    Ok((at, id.to_string()))
}

/// The body of `POST /api/sessions` (all optional; an empty body is `{}`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewSessionBody {
    /// The session's directory, relative to the caller's workspace root.
    cwd: Option<String>,
    /// The agent profile (`[[agents]]`) it is opened as.
    agent: Option<String>,
    /// `worktree`: a git worktree of its own (see `session/open`).
    isolation: Option<crate::session::worktree::Isolation>,
    /// The commit the worktree's branch starts from.
    base: Option<String>,
}

/// `POST /api/sessions`: creates a session of the caller's, as `session/open` without an id
/// does; 201 with the session.
pub async fn create_session(
    State(app): State<AppState>,
    caller: Caller,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    // The one REST route that changes something a page could ask for: the WebSocket's Origin
    // rule applies, so another site's page cannot create sessions through the browser.
    super::auth::check_origin(&headers, &app.config().server.allowed_origins)?;
    let body: NewSessionBody = if body.iter().all(u8::is_ascii_whitespace) {
        NewSessionBody::default()
    } else {
        super::error::object_body(&body)?
    };
    let sessions = app.sessions();
    let (_, row) = match body.isolation {
        Some(crate::session::worktree::Isolation::Worktree) => {
            sessions
                .create_in_worktree(
                    &caller,
                    body.cwd.as_deref(),
                    body.agent.as_deref(),
                    body.base.as_deref(),
                )
                .await?
        }
        _ if body.base.is_some() => {
            return Err(SessionError::InvalidParams(
                "base is for isolation \"worktree\" only".into(),
            )
            .into());
        }
        _ => {
            sessions
                .create_as(
                    &caller,
                    body.cwd.as_deref(),
                    body.agent.as_deref(),
                    Vec::new(),
                )
                .await?
        }
    };
    Ok((StatusCode::CREATED, Json(json!(row))))
}

/// The body of `POST /api/sessions/{id}/merge` (optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MergeBody {
    /// The commit message for what the session left uncommitted.
    message: Option<String>,
}

/// `POST /api/sessions/{id}/merge`: as `session/merge`.
pub async fn merge_worktree(
    State(app): State<AppState>,
    caller: Caller,
    headers: axum::http::HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    super::auth::check_origin(&headers, &app.config().server.allowed_origins)?;
    let body: MergeBody = if body.iter().all(u8::is_ascii_whitespace) {
        MergeBody::default()
    } else {
        super::error::object_body(&body)?
    };
    let message = body
        .message
        .unwrap_or_else(|| format!("Work of session {id}"));
    let merged = app
        .sessions()
        .end_worktree(&caller, &id, Some(&message))
        .await?;
    Ok(Json(merged))
}

/// `POST /api/sessions/{id}/discard`: as `session/discard`.
pub async fn discard_worktree(
    State(app): State<AppState>,
    caller: Caller,
    headers: axum::http::HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    super::auth::check_origin(&headers, &app.config().server.allowed_origins)?;
    Ok(Json(app.sessions().end_worktree(&caller, &id, None).await?))
}

/// Query of `GET /api/sessions/{id}/export`.
#[derive(Debug, Deserialize)]
pub struct ExportQuery {
    /// Whether the checkpoints (manifests and the contents they name) come along.
    #[serde(default)]
    checkpoints: bool,
}

/// `GET /api/sessions/{id}/export?checkpoints=`: the session as JSON Lines (see
/// `session::transfer`).
pub async fn export_session(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<ExportQuery>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse as _;
    let body = app
        .sessions()
        .export(&caller, &id, query.checkpoints)
        .await?;
    let disposition = format!("attachment; filename=\"agentd-session-{id}.jsonl\"");
    Ok((
        [
            (
                axum::http::header::CONTENT_TYPE,
                "application/jsonl".to_string(),
            ),
            (axum::http::header::CONTENT_DISPOSITION, disposition),
        ],
        body,
    )
        .into_response())
}

/// `POST /api/sessions/import`: a new session of the caller's from an export's JSON Lines;
/// 201 with `{session_id}` and the session. The body is read a line at a time, after an
/// import slot is free, and refused past [`super::MAX_IMPORT_BYTES`].
pub async fn import_session(
    State(app): State<AppState>,
    caller: Caller,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    use futures_util::StreamExt as _;
    // It creates a session, so the Origin rule of session creation applies.
    super::auth::check_origin(&headers, &app.config().server.allowed_origins)?;
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|length| length.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|length| length > super::MAX_IMPORT_BYTES as u64) {
        return Ok(too_large());
    }
    let Some(_slot) = app.import_slot().await else {
        return Err(ApiError::Unavailable("the server is shutting down".into()));
    };
    let mut seen = 0usize;
    let stream = body.into_data_stream().map(move |chunk| {
        let chunk = chunk.map_err(std::io::Error::other)?;
        seen += chunk.len();
        if seen > super::MAX_IMPORT_BYTES {
            return Err(crate::capped_read::too_large(
                "the export",
                super::MAX_IMPORT_BYTES as u64,
            ));
        }
        Ok(chunk)
    });
    let reader = tokio::io::BufReader::new(tokio_util::io::StreamReader::new(stream));
    let imported = match crate::session::transfer::read(reader).await {
        Ok(imported) => imported,
        Err(crate::session::transfer::ExportFormatError::Unreadable(io))
            if io.kind() == std::io::ErrorKind::FileTooLarge =>
        {
            return Ok(too_large());
        }
        Err(err) => return Err(ApiError::BadRequest(err.to_string())),
    };
    let row = app.sessions().import(&caller, imported).await?;
    let mut answer = json!(row);
    answer["session_id"] = json!(row.session_id);
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// The refusal of an export past [`super::MAX_IMPORT_BYTES`], as the body limit of every
/// other route answers it.
fn too_large() -> Response {
    let text = format!(
        "an export may hold at most {} bytes",
        super::MAX_IMPORT_BYTES
    );
    (StatusCode::PAYLOAD_TOO_LARGE, text).into_response()
}

/// `GET /api/sessions/{id}`.
pub async fn get_session(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let row = app.sessions().row(&caller, &id).await?;
    Ok(Json(json!(row)))
}

/// `DELETE /api/sessions/{id}`: stops the session and deletes everything it stored.
pub async fn delete_session(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    app.sessions().delete(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Query of `GET /api/sessions/{id}/events`.
#[derive(Debug, Deserialize)]
pub struct EventsQuery {
    after_seq: Option<i64>,
    limit: Option<i64>,
}

/// `GET /api/sessions/{id}/events?after_seq=&limit=`: persisted events in seq order.
pub async fn events(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<EventsQuery>,
) -> Result<Json<Value>, ApiError> {
    app.sessions().row(&caller, &id).await?;
    let limit = query.limit.unwrap_or(DEFAULT_EVENTS_PAGE);
    if !(1..=MAX_EVENTS_PAGE).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "limit must be between 1 and {MAX_EVENTS_PAGE}"
        )));
    }
    let rows = app
        .sessions()
        .store()
        .events_after(&id, query.after_seq.unwrap_or(0), limit)
        .await?;
    let events: Vec<Value> = rows
        .into_iter()
        .map(|row| {
            json!({
                "seq": row.seq,
                "method": row.method,
                "params": row.params,
                "created_at": super::rfc3339(row.created_at),
            })
        })
        .collect();
    Ok(Json(json!({ "events": events })))
}

/// `GET /api/sessions/{id}/messages`: the model-facing conversation.
pub async fn messages(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    app.sessions().row(&caller, &id).await?;
    let mut messages = app.sessions().store().messages(&id).await?;
    // Compaction markers say what the model is sent instead; the conversation is the messages.
    messages.retain(|message| message.get("role").and_then(Value::as_str) != Some("compaction"));
    Ok(Json(json!({ "messages": messages })))
}

/// `GET /api/sessions/{id}/tools`: as `tool/list`.
pub async fn session_tools(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let handle = app.sessions().handle(&caller, &id).await?;
    Ok(Json(handle.tool_list().await?))
}

/// Query of `GET /api/sessions/{id}/files`.
#[derive(Debug, Deserialize)]
pub struct FileQuery {
    path: String,
}

/// `GET /api/sessions/{id}/files?path=`: a file of the session's workspace, through the
/// symlink-safe layer, streamed.
pub async fn download_file(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<FileQuery>,
) -> Result<Response, ApiError> {
    let row = app.sessions().row(&caller, &id).await?;
    let root = app.sessions().session_root(&row);
    let rel = fs_safe::resolve_path(root.anchor(), &query.path)
        .map_err(|err| ApiError::BadRequest(err.to_string()))?;
    let opened = tokio::task::spawn_blocking(move || root.open()?.open_file(&rel))
        .await
        .map_err(|err| ApiError::Internal(err.to_string()))?;
    let file = opened.map_err(|err| match err {
        fs_safe::FsError::NotFound(path) => ApiError::NotFound(format!("no file {path}")),
        other => ApiError::BadRequest(other.to_string()),
    })?;
    let size = file.metadata().map(|m| m.len()).ok();
    let name = std::path::Path::new(&query.path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "download".into());
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(file));
    let mut response = Response::new(Body::from_stream(stream));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/octet-stream"),
    );
    if let Ok(value) = header::HeaderValue::from_str(&content_disposition(&name)) {
        headers.insert(header::CONTENT_DISPOSITION, value);
    }
    if let Some(size) = size {
        headers.insert(header::CONTENT_LENGTH, header::HeaderValue::from(size));
    }
    Ok(response)
}

/// `attachment` naming `name` (RFC 6266): a plain ASCII `filename` every client reads, and,
/// for a name that is not plain ASCII, `filename*` with its UTF-8 bytes percent-encoded.
fn content_disposition(name: &str) -> String {
    let plain = |c: char| (c.is_ascii_graphic() && c != '"' && c != '\\') || c == ' ';
    let fallback: String = name
        .chars()
        .map(|c| if plain(c) { c } else { '_' })
        .collect();
    if fallback == name {
        return format!("attachment; filename=\"{name}\"");
    }
    // RFC 5987 attr-char: what may stand for itself in `filename*`.
    const ATTR_CHAR: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'!')
        .remove(b'#')
        .remove(b'$')
        .remove(b'&')
        .remove(b'+')
        .remove(b'-')
        .remove(b'.')
        .remove(b'^')
        .remove(b'_')
        .remove(b'`')
        .remove(b'|')
        .remove(b'~');
    let encoded = percent_encoding::utf8_percent_encode(name, ATTR_CHAR);
    format!("attachment; filename=\"{fallback}\"; filename*=UTF-8''{encoded}")
}

/// `GET /api/sessions/{id}/tasks`.
pub async fn session_tasks(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    app.sessions().row(&caller, &id).await?;
    let tasks: Vec<TaskRow> = app
        .sessions()
        .store()
        .list_tasks(&id)
        .await?
        .into_iter()
        .map(with_live_size)
        .collect();
    Ok(Json(json!({ "tasks": tasks })))
}

/// `GET /api/sessions/{id}/cost`: every cost row of the session and their totals.
pub async fn cost(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    app.sessions().row(&caller, &id).await?;
    let rows = app.sessions().store().cost_rows(&id).await?;
    // A float sum of nothing is -0.0; clients should read 0.
    let total: f64 = rows.iter().fold(0.0, |sum, r| sum + r.actual_usd);
    let tokens_in: i64 = rows.iter().map(|r| r.tokens_in).sum();
    let tokens_out: i64 = rows.iter().map(|r| r.tokens_out).sum();
    let tokens_cached: i64 = rows.iter().map(|r| r.tokens_cached).sum();
    let inherited_usd = app.sessions().store().inherited_usd(&id).await?;
    Ok(Json(json!({
        "session_cost_usd": total,
        "inherited_usd": inherited_usd,
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "tokens_cached": tokens_cached,
        "rows": rows,
    })))
}

/// `GET /api/sessions/{id}/mcp`: each configured MCP server and its state, as `session/open`'s
/// `mcp` says it.
pub async fn session_mcp(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    // Asking loads the session, which starts its own servers.
    let handle = app.sessions().handle(&caller, &id).await?;
    Ok(Json(json!({ "mcp": handle.describe().await?.mcp })))
}

/// A task the caller may see.
async fn owned_task(app: &AppState, caller: &Caller, task_id: &str) -> Result<TaskRow, ApiError> {
    let unknown = || ApiError::NotFound(format!("unknown task {task_id}"));
    let task = app
        .sessions()
        .store()
        .get_task(task_id)
        .await?
        .ok_or_else(unknown)?;
    app.sessions()
        .row(caller, &task.session_id)
        .await
        .map_err(|_| unknown())?;
    Ok(task)
}

/// `GET /api/tasks/{task_id}`.
pub async fn task(
    State(app): State<AppState>,
    caller: Caller,
    Path(task_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let task = owned_task(&app, &caller, &task_id).await?;
    Ok(Json(json!(with_live_size(task))))
}

/// `GET /api/tasks/{task_id}/output`: read_task_output.
pub async fn task_output(
    State(app): State<AppState>,
    caller: Caller,
    Path(task_id): Path<String>,
    ApiQuery(params): ApiQuery<OutputParams>,
) -> Result<Json<Value>, ApiError> {
    let task = owned_task(&app, &caller, &task_id).await?;
    let query = params
        .to_query()
        .map_err(|err| ApiError::BadRequest(err.to_string()))?;
    let answer = read_task_output(&task, query)
        .await
        .map_err(|err| match err {
            TaskReadError::UnknownTask(id) => ApiError::NotFound(format!("unknown task {id}")),
            other => ApiError::Internal(other.to_string()),
        })?;
    Ok(Json(answer))
}

/// `POST /api/tasks/{task_id}/cancel`: stops a running task; answers its final state.
pub async fn cancel_task(
    State(app): State<AppState>,
    caller: Caller,
    Path(task_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let task = owned_task(&app, &caller, &task_id).await?;
    let state = if task.state == TaskState::Running {
        let handle = app.sessions().handle(&caller, &task.session_id).await?;
        handle.cancel_task(task_id.clone()).await?
    } else {
        None
    };
    // Not running in this server (already ended): report what the store says.
    let state = match state {
        Some(state) => state,
        None => owned_task(&app, &caller, &task_id).await?.state,
    };
    Ok(Json(json!({"task_id": task_id, "state": state})))
}

/// `GET /api/tools`: the server's catalog with each tool's state under the system policy.
pub async fn tools_catalog(State(app): State<AppState>, _caller: Caller) -> impl IntoResponse {
    let catalog = app.sessions().base_registry().catalog();
    Json(json!({ "tools": catalog.entries }))
}

#[cfg(test)]
mod tests {
    use super::content_disposition;

    #[test]
    fn download_names_are_quoted_and_non_ascii_ones_encoded() {
        assert_eq!(
            content_disposition("report 1.txt"),
            r#"attachment; filename="report 1.txt""#
        );
        assert_eq!(
            content_disposition("naïve résumé.pdf"),
            "attachment; filename=\"na_ve r_sum_.pdf\"; \
             filename*=UTF-8''na%C3%AFve%20r%C3%A9sum%C3%A9.pdf"
        );
        assert_eq!(
            content_disposition("a\"b\\c"),
            "attachment; filename=\"a_b_c\"; filename*=UTF-8''a%22b%5Cc"
        );
    }
}
