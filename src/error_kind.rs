//! The one vocabulary of refusals and failures a client can be answered with: each kind's wire
//! word (the WebSocket's `data.kind`, REST's `error.kind`, a tool result's `error.kind`), its
//! HTTP status, its JSON-RPC code and its MCP class, in one table.

use std::fmt;

/// How the MCP endpoint answers a failed call of this kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McpClass {
    /// A protocol error `invalid_params`: the request named something that is not there.
    InvalidParams,
    /// A protocol error `internal_error`: the server could not serve it.
    Internal,
    /// A tool result with `isError`: the model can read it and correct its call.
    ToolResult,
}

/// What one kind is on every surface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// The snake_case word clients see.
    pub word: &'static str,
    /// The HTTP status a REST answer carries.
    pub status: u16,
    /// REST's coarser `error.code`, kept from the first version for its clients.
    pub code: &'static str,
    /// The JSON-RPC `error.code` of a WebSocket answer.
    pub rpc: i64,
    /// The MCP endpoint's answer.
    pub mcp: McpClass,
}

/// JSON-RPC: the message is not JSON.
pub const RPC_PARSE_ERROR: i64 = -32700;
/// JSON-RPC: the message is JSON but not a request.
pub const RPC_INVALID_REQUEST: i64 = -32600;
/// JSON-RPC: no such method.
pub const RPC_METHOD_NOT_FOUND: i64 = -32601;
/// JSON-RPC: the params are missing, mistyped or refused.
pub const RPC_INVALID_PARAMS: i64 = -32602;
/// JSON-RPC: the server failed; details are logged.
pub const RPC_INTERNAL_ERROR: i64 = -32603;
/// JSON-RPC: the request failed in the server (the kind says how).
pub const RPC_SERVER_ERROR: i64 = -32000;
/// JSON-RPC: too much in flight; retry later.
pub const RPC_OVERLOADED: i64 = -32001;

/// Why a request was refused or failed; `as_str()` is the wire word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// No such session for this caller (another user's session looks the same).
    UnknownSession,
    /// No task of that id in the session.
    UnknownTask,
    /// No pending approval of that id.
    UnknownApproval,
    /// No pending question of that id.
    UnknownRequest,
    /// A turn is already running.
    TurnInProgress,
    /// No turn runs, or the running one has another id.
    NoActiveTurn,
    /// `session/revert` found files changed since.
    RevertConflict,
    /// `session/merge` could not merge.
    MergeConflict,
    /// The session works in no worktree.
    NoWorktree,
    /// No model is configured.
    LlmNotConfigured,
    /// The capability has no backend here.
    Unsupported,
    /// Bad parameters.
    InvalidParams,
    /// Too much in flight; retry later.
    Overloaded,
    /// A per-user limit refuses the request.
    QuotaExceeded,
    /// The store cannot write; nothing that needed a write was acknowledged.
    StorageUnavailable,
    /// The session's actor stopped while handling the request.
    SessionUnavailable,
    /// Something broke on the server's side; details are logged.
    Internal,
    /// No tool of that name.
    UnknownTool,
    /// The tool policy refuses the call.
    PolicyDenied,
    /// The call's arguments are over the size cap.
    ArgsTooLarge,
    /// The call's arguments do not match the tool's schema.
    InvalidArguments,
    /// The call was cancelled.
    Cancelled,
    /// The tool failed in a way retrying cannot fix.
    Fatal,
    /// `session/compact` found nothing to compact.
    NothingToCompact,
    /// The session's spending cap refuses the model call.
    BudgetExceeded,
    /// The compaction's summary call failed.
    CompactionFailed,
    /// A WebSocket frame that is not JSON (or a binary frame).
    ParseError,
    /// JSON that is not a request.
    InvalidRequest,
    /// A batch of requests, which the WebSocket refuses as a whole.
    BatchUnsupported,
    /// No such method.
    MethodNotFound,
    /// Missing or wrong bearer token.
    Unauthorized,
    /// The WebSocket `Origin` is not allowed.
    ForbiddenOrigin,
    /// A server without a token refuses a host name other than loopback's.
    ForbiddenHost,
    /// No such REST resource for this caller.
    NotFound,
    /// The route exists but not with this method.
    MethodNotAllowed,
    /// A dependency (the database) is not ready.
    Unavailable,
    /// The route took longer than its time limit.
    Timeout,
    /// An ACP prompt whose turn ended with an error.
    TurnFailed,
    /// An MCP server an ACP client named could not start.
    McpFailed,
    /// The turn (or the call) was stopped by `turn/interrupt` or a cancelled client.
    Interrupted,
    /// The turn ran past `turn_timeout_secs`.
    TurnTimeout,
    /// A hook stopped the prompt or the call.
    HookBlocked,
    /// The turn made `max_iterations` model calls without an answer.
    IterationLimit,
    /// The model's endpoint could not be reached or kept failing after the retries.
    LlmUnavailable,
    /// The model's endpoint kept answering 429 after the retries.
    LlmRateLimited,
    /// The model answered something that is not a valid completion.
    LlmBadResponse,
    /// The conversation no longer fits the model's context window.
    ContextOverflow,
    /// The model's endpoint refused the configured credentials.
    LlmUnauthorized,
}

use McpClass::{Internal as McpInternal, InvalidParams as McpInvalid, ToolResult as McpTool};

/// One row: word, HTTP status, REST code, JSON-RPC code, MCP class.
const fn row(word: &'static str, status: u16, code: &'static str, rpc: i64, mcp: McpClass) -> Row {
    Row {
        word,
        status,
        code,
        rpc,
        mcp,
    }
}

impl ErrorKind {
    /// Every kind, in the table's order.
    pub const ALL: &'static [ErrorKind] = &[
        Self::UnknownSession,
        Self::UnknownTask,
        Self::UnknownApproval,
        Self::UnknownRequest,
        Self::TurnInProgress,
        Self::NoActiveTurn,
        Self::RevertConflict,
        Self::MergeConflict,
        Self::NoWorktree,
        Self::LlmNotConfigured,
        Self::Unsupported,
        Self::InvalidParams,
        Self::Overloaded,
        Self::QuotaExceeded,
        Self::StorageUnavailable,
        Self::SessionUnavailable,
        Self::Internal,
        Self::UnknownTool,
        Self::PolicyDenied,
        Self::ArgsTooLarge,
        Self::InvalidArguments,
        Self::Cancelled,
        Self::Fatal,
        Self::NothingToCompact,
        Self::BudgetExceeded,
        Self::CompactionFailed,
        Self::ParseError,
        Self::InvalidRequest,
        Self::BatchUnsupported,
        Self::MethodNotFound,
        Self::Unauthorized,
        Self::ForbiddenOrigin,
        Self::ForbiddenHost,
        Self::NotFound,
        Self::MethodNotAllowed,
        Self::Unavailable,
        Self::Timeout,
        Self::TurnFailed,
        Self::McpFailed,
        Self::Interrupted,
        Self::TurnTimeout,
        Self::HookBlocked,
        Self::IterationLimit,
        Self::LlmUnavailable,
        Self::LlmRateLimited,
        Self::LlmBadResponse,
        Self::ContextOverflow,
        Self::LlmUnauthorized,
    ];

    /// The table: what this kind is on every surface.
    pub const fn row(self) -> Row {
        const ERR: i64 = RPC_SERVER_ERROR;
        match self {
            Self::UnknownSession => row("unknown_session", 404, "not_found", ERR, McpInvalid),
            Self::UnknownTask => row("unknown_task", 404, "not_found", ERR, McpTool),
            Self::UnknownApproval => row("unknown_approval", 404, "not_found", ERR, McpTool),
            Self::UnknownRequest => row("unknown_request", 404, "not_found", ERR, McpTool),
            Self::TurnInProgress => row("turn_in_progress", 409, "conflict", ERR, McpTool),
            Self::NoActiveTurn => row("no_active_turn", 409, "conflict", ERR, McpTool),
            Self::RevertConflict => row("revert_conflict", 409, "conflict", ERR, McpTool),
            Self::MergeConflict => row("merge_conflict", 409, "conflict", ERR, McpTool),
            Self::NoWorktree => row("no_worktree", 409, "conflict", ERR, McpTool),
            Self::LlmNotConfigured => row("llm_not_configured", 400, "bad_request", ERR, McpTool),
            Self::Unsupported => row("unsupported", 400, "bad_request", ERR, McpTool),
            Self::InvalidParams => row(
                "invalid_params",
                400,
                "bad_request",
                RPC_INVALID_PARAMS,
                McpTool,
            ),
            Self::Overloaded => row("overloaded", 503, "overloaded", RPC_OVERLOADED, McpTool),
            Self::QuotaExceeded => row("quota_exceeded", 429, "quota_exceeded", ERR, McpTool),
            Self::StorageUnavailable => {
                row("storage_unavailable", 503, "unavailable", ERR, McpTool)
            }
            Self::SessionUnavailable => {
                row("session_unavailable", 503, "unavailable", ERR, McpInternal)
            }
            Self::Internal => row("internal", 500, "internal", RPC_INTERNAL_ERROR, McpInternal),
            Self::UnknownTool => row("unknown_tool", 400, "bad_request", ERR, McpInvalid),
            Self::PolicyDenied => row("policy_denied", 400, "bad_request", ERR, McpTool),
            Self::ArgsTooLarge => row("args_too_large", 400, "bad_request", ERR, McpTool),
            Self::InvalidArguments => row("invalid_arguments", 400, "bad_request", ERR, McpTool),
            Self::Cancelled => row("cancelled", 400, "bad_request", ERR, McpTool),
            Self::Fatal => row("fatal", 400, "bad_request", ERR, McpTool),
            Self::NothingToCompact => row("nothing_to_compact", 400, "bad_request", ERR, McpTool),
            Self::BudgetExceeded => row("budget_exceeded", 400, "bad_request", ERR, McpTool),
            Self::CompactionFailed => row("compaction_failed", 400, "bad_request", ERR, McpTool),
            Self::ParseError => row(
                "parse_error",
                400,
                "bad_request",
                RPC_PARSE_ERROR,
                McpInvalid,
            ),
            Self::InvalidRequest => row(
                "invalid_request",
                400,
                "bad_request",
                RPC_INVALID_REQUEST,
                McpInvalid,
            ),
            Self::BatchUnsupported => row(
                "batch_unsupported",
                400,
                "bad_request",
                RPC_INVALID_REQUEST,
                McpInvalid,
            ),
            Self::MethodNotFound => row(
                "method_not_found",
                404,
                "not_found",
                RPC_METHOD_NOT_FOUND,
                McpInvalid,
            ),
            Self::Unauthorized => row("unauthorized", 401, "unauthorized", ERR, McpInvalid),
            Self::ForbiddenOrigin => {
                row("forbidden_origin", 403, "forbidden_origin", ERR, McpInvalid)
            }
            Self::ForbiddenHost => row("forbidden_host", 403, "forbidden_host", ERR, McpInvalid),
            Self::NotFound => row("not_found", 404, "not_found", ERR, McpInvalid),
            Self::MethodNotAllowed => row(
                "method_not_allowed",
                405,
                "method_not_allowed",
                RPC_METHOD_NOT_FOUND,
                McpInvalid,
            ),
            Self::Unavailable => row("unavailable", 503, "unavailable", ERR, McpInternal),
            Self::Timeout => row("timeout", 503, "timeout", ERR, McpInternal),
            Self::TurnFailed => row("turn_failed", 500, "internal", ERR, McpInternal),
            Self::McpFailed => row("mcp_failed", 400, "bad_request", ERR, McpTool),
            Self::Interrupted => row("interrupted", 409, "conflict", ERR, McpTool),
            Self::TurnTimeout => row("turn_timeout", 504, "timeout", ERR, McpInternal),
            Self::HookBlocked => row("hook_blocked", 400, "bad_request", ERR, McpTool),
            Self::IterationLimit => row("iteration_limit", 400, "bad_request", ERR, McpTool),
            // The model is a dependency: its failures are the server's, not the caller's.
            Self::LlmUnavailable => row("llm_unavailable", 502, "unavailable", ERR, McpInternal),
            Self::LlmRateLimited => row("llm_rate_limited", 503, "unavailable", ERR, McpInternal),
            Self::LlmBadResponse => row("llm_bad_response", 502, "unavailable", ERR, McpInternal),
            Self::ContextOverflow => row("context_overflow", 400, "bad_request", ERR, McpTool),
            Self::LlmUnauthorized => row("llm_unauthorized", 502, "unavailable", ERR, McpInternal),
        }
    }

    /// The snake_case word clients see.
    pub const fn as_str(self) -> &'static str {
        self.row().word
    }

    /// The kind a word names (as another node or an old record wrote it), if any.
    pub fn from_word(word: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|kind| kind.as_str() == word)
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for ErrorKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl PartialEq<&str> for ErrorKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_listed_once_with_its_own_word() {
        let mut words: Vec<&str> = ErrorKind::ALL.iter().map(|k| k.as_str()).collect();
        let listed = words.len();
        words.sort_unstable();
        words.dedup();
        assert_eq!(words.len(), listed, "a word is used twice");
        for kind in ErrorKind::ALL {
            assert_eq!(ErrorKind::from_word(kind.as_str()), Some(*kind));
            assert!(
                kind.as_str()
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b == b'_')
            );
            assert!((400..600).contains(&kind.row().status));
        }
        assert_eq!(ErrorKind::from_word("no_such_kind"), None);
        assert_eq!(
            serde_json::to_value(ErrorKind::TurnInProgress).unwrap(),
            "turn_in_progress"
        );
    }

    #[test]
    fn the_table_keeps_the_wire_forms() {
        let unknown = ErrorKind::UnknownSession.row();
        assert_eq!((unknown.status, unknown.code), (404, "not_found"));
        assert_eq!(unknown.mcp, McpClass::InvalidParams);
        assert_eq!(ErrorKind::TurnInProgress.row().status, 409);
        assert_eq!(ErrorKind::Overloaded.row().rpc, RPC_OVERLOADED);
        assert_eq!(ErrorKind::InvalidParams.row().rpc, RPC_INVALID_PARAMS);
        assert_eq!(ErrorKind::Internal.row().rpc, RPC_INTERNAL_ERROR);
        assert_eq!(ErrorKind::PolicyDenied.row().rpc, RPC_SERVER_ERROR);
        assert_eq!(ErrorKind::StorageUnavailable.row().status, 503);
        assert_eq!(ErrorKind::QuotaExceeded.row().status, 429);
    }
}
