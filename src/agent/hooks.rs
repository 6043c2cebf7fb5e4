//! Operator hooks (`[[hooks]]`): a command or a URL run around a session's work, speaking
//! Claude Code's hook JSON, so hooks written for it work here.
//!
//! A command hook runs `sh -c COMMAND` in the session's sandbox, in the session's cwd, with
//! the event's JSON on stdin: exit 0 lets things go on (its stdout may hold a JSON decision),
//! exit 2 blocks with its stderr as the reason, any other exit or a timeout is reported and
//! changes nothing. A URL hook POSTs the same JSON, signed with HMAC-SHA256 of the body
//! (`X-Agentd-Signature: sha256=<hex>`) when it has a secret, tried up to three times within
//! its timeout; a 2xx answer's body is read like a command's stdout. Every hook that ran is
//! told as a `hook/ran` event with what it decided: none is skipped without a word.
//!
//! A hook's `allow` only spares a person the question the session's ask rules would put: a
//! deny rule and the `.git` rule still hold (see `agent::call`). A hook runs until its
//! timeout or until the turn it serves is interrupted, whichever comes first: its process
//! group is killed, or its request dropped, at once. Matchers take Claude Code's tool names
//! too, and one that could match no tool is refused at start-up ([`HookConfig::unmatched`]).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

use crate::builtin::process::{kill_group, shell_command};
use crate::capped_read::{Prefix, read_prefix, response_prefix};
use crate::secret::Secret;
use crate::tools::policy::{MCP_TOOL_PREFIX, mcp_group_names};
use crate::tools::workspace::Workspace;

/// Tries of a URL hook before it is reported as failed.
const URL_TRIES: u32 = 3;
/// Most bytes of a hook's stdout or stderr read.
const MAX_OUTPUT_BYTES: usize = 64 * 1024;

/// Claude Code's tool names, which matchers take as they are written (case-sensitive), and
/// the tools each stands for here. `Bash` names the command tools one by one until tool metas
/// say which tools run commands (`group:commands`).
const CLAUDE_CODE_TOOLS: &[(&str, &[&str])] = &[
    // Every tool whose meta says it runs or types into a command, whatever it is called.
    ("Bash", &["group:commands"]),
    ("Edit", &["edit_file", "diff_edit", "apply_patch"]),
    ("MultiEdit", &["edit_file", "diff_edit", "apply_patch"]),
    ("Write", &["write_file"]),
    ("Read", &["read_file", "view_image"]),
    ("Glob", &["glob"]),
    ("Grep", &["grep"]),
    ("LS", &["list_dir"]),
    ("WebFetch", &["web_fetch"]),
    ("WebSearch", &["web_search"]),
    ("Task", &["spawn_agent"]),
    ("TodoWrite", &["update_plan"]),
];

/// Whether one `|` alternative of a matcher names `tool` (in `groups`): a Claude Code tool
/// name, `group:NAME`, a `prefix*` or `prefix.*` wildcard, or the name itself.
fn alternative_matches(entry: &str, tool: &str, groups: &[&str]) -> bool {
    if let Some((_, tools)) = CLAUDE_CODE_TOOLS.iter().find(|(alias, _)| *alias == entry) {
        return tools
            .iter()
            .any(|stands_for| crate::tools::policy::entry_matches(stands_for, tool, groups));
    }
    if let Some(prefix) = entry.strip_suffix(".*") {
        return tool.starts_with(prefix);
    }
    crate::tools::policy::entry_matches(entry, tool, groups)
}

/// The tools a server can offer, for checking matchers before it starts.
#[derive(Debug, Default)]
pub struct KnownTools<'a> {
    /// Each tool's name and groups: built-ins, the server's own, plugins.
    pub tools: Vec<(&'a str, &'a [&'static str])>,
    /// The configured MCP servers: their tools are named only once they list them, so any
    /// `mcp__<server>__…` name is taken as known.
    pub mcp_servers: Vec<&'a str>,
}

impl KnownTools<'_> {
    /// Whether one `|` alternative of a matcher could name a tool of these.
    fn could_match(&self, entry: &str) -> bool {
        if CLAUDE_CODE_TOOLS.iter().any(|(alias, _)| *alias == entry) {
            return true;
        }
        if let Some(group) = entry.strip_prefix("group:") {
            return self.mcp_servers.iter().any(|server| {
                mcp_group_names(group, &crate::mcp::tool_name(server, "x")) == Some(true)
            }) || (mcp_group_names(group, "").is_none()
                && self.tools.iter().any(|(_, groups)| groups.contains(&group)));
        }
        let prefix = entry.strip_suffix(".*").or_else(|| entry.strip_suffix('*'));
        let mcp = self.mcp_servers.iter().any(|server| {
            let tools = format!("{MCP_TOOL_PREFIX}{server}__");
            match prefix {
                Some(prefix) => tools.starts_with(prefix) || prefix.starts_with(&tools),
                None => entry.len() > tools.len() && entry.starts_with(&tools),
            }
        });
        mcp || self
            .tools
            .iter()
            .any(|(name, groups)| alternative_matches(entry, name, groups))
    }
}

/// When a hook runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum HookEvent {
    /// Before a tool call runs (after the model or client made it, before approval): may
    /// block it, allow it without asking, make it ask, or rewrite its input.
    PreToolUse,
    /// After a tool call ran: may add context to its result, or a reason to reconsider.
    PostToolUse,
    /// When a turn starts, before the model sees the prompt: may block it or add context.
    UserPromptSubmit,
    /// When a turn has ended.
    Stop,
    /// At the first turn a loaded session runs: may add context.
    SessionStart,
    /// When a loaded session stops: closed (deleted), unloaded when idle, or at shutdown.
    SessionEnd,
    /// Before the older conversation is summarised (by a turn, or `session/compact`).
    PreCompact,
}

impl HookEvent {
    /// The name in the configuration and the JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PreToolUse => "PreToolUse",
            Self::PostToolUse => "PostToolUse",
            Self::UserPromptSubmit => "UserPromptSubmit",
            Self::Stop => "Stop",
            Self::SessionStart => "SessionStart",
            Self::SessionEnd => "SessionEnd",
            Self::PreCompact => "PreCompact",
        }
    }
}

/// `[[hooks]]`: one hook.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {
    /// What `hook/ran` calls it; without it, its command, or a URL hook's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// When it runs.
    pub event: HookEvent,
    /// For tool events: the tools it runs for (a name, a Claude Code tool name, `*` or `.*`
    /// wildcards, `group:NAME`, alternatives `a|b`); every tool when omitted or empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matcher: Option<String>,
    /// A shell command, run in the session's sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// An `http(s)` URL the event's JSON is POSTed to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The environment variable holding the URL hook's signing secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_env: Option<String>,
    /// Seconds the hook may take.
    #[serde(default = "default_timeout")]
    pub timeout_secs: u64,
    /// The signing secret, read from `secret_env`.
    #[serde(skip)]
    pub secret: Option<Secret>,
}

fn default_timeout() -> u64 {
    30
}

impl HookConfig {
    /// Why the entry is unusable, if it is.
    pub fn invalid(&self) -> Option<String> {
        match (&self.command, &self.url) {
            (Some(command), None) if !command.trim().is_empty() => {}
            (None, Some(url)) => {
                let parsed = reqwest::Url::parse(url).ok();
                if !parsed.is_some_and(|u| matches!(u.scheme(), "http" | "https")) {
                    return Some(format!("url {url:?} is not an http(s) URL"));
                }
            }
            _ => return Some("give either command or url".into()),
        }
        if self.timeout_secs == 0 {
            return Some("timeout_secs must be at least 1".into());
        }
        if self
            .name
            .as_deref()
            .is_some_and(|name| name.trim().is_empty())
        {
            return Some("name must not be empty".into());
        }
        None
    }

    /// What `hook/ran` (stored, replayed, exported) and a block's reason call it: its `name`,
    /// else its command, else its URL's host alone, since a URL's path and query often carry
    /// a secret.
    pub fn label(&self) -> String {
        if let Some(name) = &self.name {
            return name.clone();
        }
        if let Some(command) = &self.command {
            return command.clone();
        }
        self.url
            .as_deref()
            .and_then(|url| reqwest::Url::parse(url).ok())
            .and_then(|url| url.host_str().map(str::to_string))
            .unwrap_or_else(|| "url hook".to_string())
    }

    /// Whether it runs for `tool` (in `groups`); hooks of events without a tool always do.
    fn matches(&self, tool: Option<&str>, groups: &[&str]) -> bool {
        match (self.tool_matcher(), tool) {
            (None, _) | (_, None) => true,
            (Some(matcher), Some(tool)) => matcher
                .split('|')
                .any(|entry| alternative_matches(entry.trim(), tool, groups)),
        }
    }

    /// Its matcher, when it has one that narrows: an empty one means every tool, as in Claude
    /// Code.
    fn tool_matcher(&self) -> Option<&str> {
        self.matcher.as_deref().filter(|m| !m.trim().is_empty())
    }

    /// For a tool event's hook, the alternative of its matcher that can match none of `known`:
    /// a typo (`shel`) that would leave the hook silently idle.
    pub fn unmatched(&self, known: &KnownTools<'_>) -> Option<String> {
        if !matches!(self.event, HookEvent::PreToolUse | HookEvent::PostToolUse) {
            return None;
        }
        self.tool_matcher()?
            .split('|')
            .map(str::trim)
            .find(|entry| !known.could_match(entry))
            .map(str::to_string)
    }

    /// A path its command names inside `workspace`, or relative to the session's cwd (which
    /// lies in the workspace): a script there can be rewritten by the agent the hook is meant
    /// to check. A warning, not an error: the words are read without a shell.
    pub fn workspace_path(&self, workspace: &Path) -> Option<String> {
        let command = self.command.as_deref()?;
        let real = std::fs::canonicalize(workspace).ok();
        let inside = |path: &Path| {
            path.starts_with(workspace)
                || real.as_deref().is_some_and(|real| path.starts_with(real))
        };
        for segment in command.split(|c: char| ";|&()\n".contains(c)) {
            let words = segment
                .split(|c: char| c.is_whitespace() || "\"'`<>".contains(c))
                .filter(|word| !word.is_empty());
            // The program is the first word that assigns no variable.
            let mut program = true;
            for word in words {
                // `--config=./x` and `X=./x` name `./x`.
                let path = word.rsplit('=').next().unwrap_or(word);
                let named = if path.starts_with('/') {
                    inside(Path::new(path))
                } else {
                    path.starts_with("./")
                        || path.starts_with("../")
                        || (path.contains('/')
                            && !path.starts_with(['~', '$', '-'])
                            && !path.contains("://")
                            && (program || SCRIPT_ENDINGS.iter().any(|end| path.ends_with(end))))
                };
                if named {
                    return Some(path.to_string());
                }
                if !(program && word.contains('=')) {
                    program = false;
                }
            }
        }
        None
    }
}

/// How a script's name ends, for a relative path that is an interpreter's argument.
const SCRIPT_ENDINGS: &[&str] = &[".sh", ".py", ".js", ".mjs", ".cjs", ".ts", ".rb", ".pl"];

/// What a hook decided, as `hook/ran` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Nothing to say: things go on.
    None,
    /// Go on without asking for approval (`permissionDecision: "allow"`).
    Allow,
    /// Ask a person first (`permissionDecision: "ask"`).
    Ask,
    /// Stop it (exit 2, `decision: "block"`, `permissionDecision: "deny"`).
    Block,
    /// The hook failed (another exit, a bad answer): reported, changes nothing.
    Error,
    /// The hook took longer than its timeout: reported, changes nothing.
    Timeout,
}

/// One hook's run, for `hook/ran`.
#[derive(Debug, Clone)]
pub struct Ran {
    /// Its command or URL.
    pub hook: String,
    /// The event it ran for.
    pub event: HookEvent,
    /// What it decided.
    pub decision: Decision,
    /// Why, when it said or failed.
    pub reason: Option<String>,
    /// How long it took.
    pub duration: Duration,
}

/// What the hooks of one event decided together: the first block wins.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Set when a hook blocked, with its reason.
    pub blocked: Option<String>,
    /// A hook allowed the call without asking.
    pub allow: bool,
    /// A hook asked for a person's approval.
    pub ask: bool,
    /// The input a hook rewrote the call's to (the last one's).
    pub updated_input: Option<Value>,
    /// Context the hooks added, in order.
    pub context: Vec<String>,
    /// Every hook that ran.
    pub ran: Vec<Ran>,
    /// The work the hooks served was interrupted while one ran: it was stopped, and the
    /// hooks after it did not run.
    pub interrupted: bool,
}

/// The hooks of one session: they run in its sandbox, in its cwd.
pub struct SessionHooks {
    hooks: Arc<[HookConfig]>,
    /// The groups of the session's tools, for `group:` matchers.
    groups: crate::tools::policy::ToolGroups,
    workspace: Arc<Workspace>,
    session_id: String,
    client: reqwest::Client,
}

impl std::fmt::Debug for SessionHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHooks")
            .field("hooks", &self.hooks.len())
            .finish_non_exhaustive()
    }
}

impl SessionHooks {
    /// The hooks `hooks` for the session `session_id` working in `workspace`; `None` when
    /// there are none.
    pub fn new(
        hooks: &Arc<[HookConfig]>,
        groups: crate::tools::policy::ToolGroups,
        workspace: Arc<Workspace>,
        session_id: &str,
    ) -> Option<Arc<Self>> {
        if hooks.is_empty() {
            return None;
        }
        Some(Arc::new(Self {
            hooks: Arc::clone(hooks),
            groups,
            workspace,
            session_id: session_id.to_string(),
            client: reqwest::Client::new(),
        }))
    }

    fn groups_of(&self, tool: Option<&str>) -> &[&'static str] {
        tool.map_or(&[], |tool| self.groups.of(tool))
    }

    /// Whether any hook runs for `event` (and `tool`, for tool events).
    pub fn any(&self, event: HookEvent, tool: Option<&str>) -> bool {
        self.hooks
            .iter()
            .any(|hook| hook.event == event && hook.matches(tool, self.groups_of(tool)))
    }

    /// Runs the hooks of `event` (for `tool`, when given) one after the other with the
    /// event's JSON: `fields` plus `hook_event_name`, `session_id` and `cwd`. When `cancel`
    /// fires (the turn is interrupted) the running hook is stopped at once and no other runs.
    pub async fn run(
        &self,
        event: HookEvent,
        tool: Option<&str>,
        fields: Value,
        cancel: &CancellationToken,
    ) -> Outcome {
        let mut payload = json!({
            "hook_event_name": event.as_str(),
            "session_id": self.session_id,
            "cwd": self.workspace.root().display().to_string(),
        });
        if let (Value::Object(into), Value::Object(from)) = (&mut payload, fields) {
            into.extend(from);
        }
        let body = payload.to_string();
        let mut outcome = Outcome::default();
        for hook in self.hooks.iter() {
            if hook.event != event || !hook.matches(tool, self.groups_of(tool)) {
                continue;
            }
            if cancel.is_cancelled() {
                outcome.interrupted = true;
                break;
            }
            let started = Instant::now();
            let timeout = Duration::from_secs(hook.timeout_secs);
            let answer = match (&hook.command, &hook.url) {
                (Some(command), _) => self.run_command(command, &body, timeout, cancel).await,
                (None, Some(url)) => {
                    let post = self.post(url, hook.secret.as_ref(), &body, timeout);
                    tokio::select! {
                        answer = post => answer,
                        // Dropping the request's future closes its connection.
                        () = cancel.cancelled() => Answer::Interrupted,
                    }
                }
                (None, None) => Answer::Failed("no command or url".into()),
            };
            outcome.interrupted = matches!(answer, Answer::Interrupted);
            let (decision, reason) = read_answer(answer, &mut outcome);
            if decision == Decision::Block && outcome.blocked.is_none() {
                outcome.blocked = Some(reason.clone().unwrap_or_else(|| {
                    format!("blocked by the {} hook {:?}", event.as_str(), hook.label())
                }));
            }
            outcome.ran.push(Ran {
                hook: hook.label(),
                event,
                decision,
                reason,
                duration: started.elapsed(),
            });
            if outcome.blocked.is_some() || outcome.interrupted {
                break;
            }
        }
        outcome
    }

    async fn run_command(
        &self,
        command: &str,
        body: &str,
        timeout: Duration,
        cancel: &CancellationToken,
    ) -> Answer {
        let mut process = match shell_command(&self.workspace, command, self.workspace.root()) {
            Ok(process) => process,
            Err(err) => return Answer::Failed(format!("cannot start: {err}")),
        };
        process
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = match process.spawn() {
            Ok(child) => child,
            Err(err) => return Answer::Failed(format!("cannot start: {err}")),
        };
        let pgid = child.id().unwrap_or(0);
        let (stdin, stdout, stderr) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take());
        let input = body.as_bytes().to_vec();
        let run = async move {
            let feed = async move {
                if let Some(mut stdin) = stdin {
                    // A hook that does not read its input is no failure.
                    let _ = stdin.write_all(&input).await;
                }
            };
            // Each stream costs at most its cap, however much the hook prints; the rest is
            // read and dropped so the hook is never stopped by a full pipe.
            let out = async move {
                match stdout {
                    Some(stdout) => read_prefix(stdout, MAX_OUTPUT_BYTES).await,
                    None => Ok(Prefix::default()),
                }
            };
            let err = async move {
                match stderr {
                    Some(stderr) => read_prefix(stderr, MAX_OUTPUT_BYTES).await,
                    None => Ok(Prefix::default()),
                }
            };
            let ((), out, err) = tokio::join!(feed, out, err);
            let status = child.wait().await?;
            Ok::<_, std::io::Error>((status, out?, err?))
        };
        let ended = tokio::select! {
            ended = tokio::time::timeout(timeout, run) => ended,
            () = cancel.cancelled() => {
                kill_group(pgid);
                return Answer::Interrupted;
            }
        };
        match ended {
            Err(_) => {
                kill_group(pgid);
                Answer::TimedOut
            }
            Ok(Err(err)) => Answer::Failed(format!("cannot run: {err}")),
            Ok(Ok((status, stdout, stderr))) => Answer::Exited {
                code: status.code(),
                stdout: String::from_utf8_lossy(&stdout.bytes).into_owned(),
                stderr: String::from_utf8_lossy(&stderr.bytes).into_owned(),
            },
        }
    }

    async fn post(
        &self,
        url: &str,
        secret: Option<&Secret>,
        body: &str,
        timeout: Duration,
    ) -> Answer {
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        for attempt in 0..URL_TRIES {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Answer::TimedOut;
            }
            let mut request = self
                .client
                .post(url)
                .header("content-type", "application/json")
                .timeout(left)
                .body(body.to_string());
            if let Some(secret) = secret {
                request = request.header("x-agentd-signature", signature(secret, body));
            }
            match request.send().await {
                Ok(response) if response.status().is_success() => {
                    let body = response_prefix(response, MAX_OUTPUT_BYTES).await;
                    return Answer::Exited {
                        code: Some(0),
                        stdout: String::from_utf8_lossy(&body.bytes).into_owned(),
                        stderr: String::new(),
                    };
                }
                Ok(response) if response.status().is_client_error() => {
                    return Answer::Failed(format!("answered HTTP {}", response.status()));
                }
                Ok(response) => last = format!("answered HTTP {}", response.status()),
                Err(err) if err.is_timeout() => return Answer::TimedOut,
                // Without the URL: the reason is stored in `hook/ran`, and the URL may hold
                // a secret.
                Err(err) => last = format!("cannot reach it: {}", err.without_url()),
            }
            if attempt + 1 < URL_TRIES {
                tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
            }
        }
        Answer::Failed(last)
    }
}

/// `sha256=` and the hex HMAC-SHA256 of `body` under `secret`.
pub fn signature(secret: &Secret, body: &str) -> String {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.expose().as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(body.as_bytes());
    let bytes = mac.finalize().into_bytes();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

/// How a hook ended.
#[derive(Debug)]
enum Answer {
    Exited {
        code: Option<i32>,
        stdout: String,
        stderr: String,
    },
    TimedOut,
    /// Stopped because the turn it served was interrupted.
    Interrupted,
    Failed(String),
}

/// Claude Code's hook output, the parts this server acts on.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct HookOutput {
    #[serde(default)]
    decision: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    hook_specific_output: Option<SpecificOutput>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct SpecificOutput {
    #[serde(default)]
    permission_decision: Option<String>,
    #[serde(default)]
    permission_decision_reason: Option<String>,
    #[serde(default)]
    updated_input: Option<Value>,
    #[serde(default)]
    additional_context: Option<String>,
}

/// The decision of one hook's answer, folding what it adds into `outcome`.
fn read_answer(answer: Answer, outcome: &mut Outcome) -> (Decision, Option<String>) {
    let (code, stdout, stderr) = match answer {
        Answer::TimedOut => return (Decision::Timeout, None),
        Answer::Interrupted => {
            return (
                Decision::Error,
                Some("stopped: the turn was interrupted".into()),
            );
        }
        Answer::Failed(why) => return (Decision::Error, Some(why)),
        Answer::Exited {
            code,
            stdout,
            stderr,
        } => (code, stdout, stderr),
    };
    match code {
        Some(0) => {}
        Some(2) => {
            let reason = stderr.trim();
            return (
                Decision::Block,
                Some(if reason.is_empty() {
                    "blocked by a hook (exit 2)".to_string()
                } else {
                    reason.to_string()
                }),
            );
        }
        other => {
            let status = other.map_or("a signal".to_string(), |c| format!("exit {c}"));
            let detail = stderr.trim();
            return (
                Decision::Error,
                Some(if detail.is_empty() {
                    status
                } else {
                    format!("{status}: {detail}")
                }),
            );
        }
    }
    let text = stdout.trim();
    if !text.starts_with('{') {
        return (Decision::None, None);
    }
    let Ok(parsed) = serde_json::from_str::<HookOutput>(text) else {
        return (
            Decision::Error,
            Some("its output starts like JSON but is not a hook answer".into()),
        );
    };
    let specific = parsed.hook_specific_output.unwrap_or_default();
    if let Some(input) = specific.updated_input {
        outcome.updated_input = Some(input);
    }
    if let Some(context) = specific.additional_context.filter(|c| !c.trim().is_empty()) {
        outcome.context.push(context);
    }
    if parsed.decision.as_deref() == Some("block") {
        return (Decision::Block, parsed.reason);
    }
    match specific.permission_decision.as_deref() {
        Some("deny") => (
            Decision::Block,
            specific.permission_decision_reason.or(parsed.reason),
        ),
        Some("ask") => {
            outcome.ask = true;
            (Decision::Ask, specific.permission_decision_reason)
        }
        Some("allow") => {
            outcome.allow = true;
            (Decision::Allow, specific.permission_decision_reason)
        }
        _ => (Decision::None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exited(code: i32, stdout: &str, stderr: &str) -> Answer {
        Answer::Exited {
            code: Some(code),
            stdout: stdout.into(),
            stderr: stderr.into(),
        }
    }

    #[test]
    fn answers_read_as_claude_code_hooks_mean_them() {
        let mut outcome = Outcome::default();
        assert_eq!(
            read_answer(exited(2, "", "no rm here\n"), &mut outcome),
            (Decision::Block, Some("no rm here".into()))
        );
        assert_eq!(
            read_answer(exited(0, "fine", ""), &mut outcome).0,
            Decision::None
        );
        assert_eq!(
            read_answer(exited(1, "", "oops"), &mut outcome),
            (Decision::Error, Some("exit 1: oops".into()))
        );
        let deny = r#"{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny", "permissionDecisionReason": "not on main"}}"#;
        assert_eq!(
            read_answer(exited(0, deny, ""), &mut outcome),
            (Decision::Block, Some("not on main".into()))
        );
        let rewrite = r#"{"hookSpecificOutput": {"permissionDecision": "allow", "updatedInput": {"command": "ls"}, "additionalContext": "checked"}}"#;
        assert_eq!(
            read_answer(exited(0, rewrite, ""), &mut outcome).0,
            Decision::Allow
        );
        assert_eq!(outcome.updated_input, Some(json!({"command": "ls"})));
        assert_eq!(outcome.context, ["checked"]);
        assert!(outcome.allow);
        let block = r#"{"decision": "block", "reason": "tests fail"}"#;
        assert_eq!(
            read_answer(exited(0, block, ""), &mut outcome),
            (Decision::Block, Some("tests fail".into()))
        );
        assert_eq!(
            read_answer(Answer::TimedOut, &mut outcome).0,
            Decision::Timeout
        );
    }

    #[test]
    fn matchers_take_names_wildcards_groups_and_alternatives() {
        let hook = |matcher: Option<&str>| HookConfig {
            name: None,
            event: HookEvent::PreToolUse,
            matcher: matcher.map(str::to_string),
            command: Some("true".into()),
            url: None,
            secret_env: None,
            timeout_secs: 5,
            secret: None,
        };
        assert!(hook(None).matches(Some("shell"), &[]));
        assert!(hook(Some("shell")).matches(Some("shell"), &[]));
        assert!(!hook(Some("shell")).matches(Some("read_file"), &[]));
        assert!(hook(Some("web_*")).matches(Some("web_fetch"), &[]));
        assert!(hook(Some("group:fs")).matches(Some("write_file"), &["fs"]));
        assert!(!hook(Some("group:fs")).matches(Some("grep"), &["search"]));
        assert!(hook(Some("shell|write_file")).matches(Some("write_file"), &["fs"]));
        assert!(hook(Some("shell")).invalid().is_none());
        let mut both = hook(None);
        both.url = Some("http://127.0.0.1:1/".into());
        assert!(both.invalid().is_some());
        let mut no_action = hook(None);
        no_action.command = None;
        assert!(
            no_action
                .invalid()
                .unwrap()
                .contains("either command or url")
        );
    }

    fn tool_hook(matcher: &str) -> HookConfig {
        HookConfig {
            name: None,
            event: HookEvent::PreToolUse,
            matcher: Some(matcher.to_string()),
            command: Some("true".into()),
            url: None,
            secret_env: None,
            timeout_secs: 5,
            secret: None,
        }
    }

    #[test]
    fn claude_code_tool_names_match_the_tools_they_stand_for() {
        let metas = crate::builtin::metas();
        let groups_of = |tool: &str| {
            metas
                .iter()
                .find(|meta| meta.name == tool)
                .map(|meta| meta.groups.clone())
                .unwrap_or_default()
        };
        let runs =
            |matcher: &str, tool: &str| tool_hook(matcher).matches(Some(tool), &groups_of(tool));
        for tool in ["shell", "exec_command", "write_stdin"] {
            assert!(runs("Bash", tool), "{tool}");
        }
        assert!(!runs("Bash", "read_file"));
        for tool in ["edit_file", "diff_edit", "apply_patch", "write_file"] {
            assert!(runs("Edit|Write", tool), "{tool}");
            assert!(runs("Read | Edit | Write", tool), "{tool}");
        }
        assert!(runs("MultiEdit", "apply_patch"));
        assert!(!runs("Edit|Write", "read_file"));
        assert!(runs("Read", "read_file") && runs("Read", "view_image"));
        for (alias, tool) in [
            ("Glob", "glob"),
            ("Grep", "grep"),
            ("LS", "list_dir"),
            ("WebFetch", "web_fetch"),
            ("WebSearch", "web_search"),
            ("Task", "spawn_agent"),
            ("TodoWrite", "update_plan"),
        ] {
            assert!(runs(alias, tool), "{alias}");
        }
        // As in Claude Code, names are case-sensitive; an empty matcher is every tool.
        assert!(!runs("bash", "shell") && !runs("BASH", "shell"));
        assert!(runs("", "grep") && runs("mcp__fs__.*", "mcp__fs__read"));
        // Every tool or group an alias stands for is one the server has.
        for (alias, tools) in CLAUDE_CODE_TOOLS {
            for tool in *tools {
                let known = match tool.strip_prefix("group:") {
                    Some(group) => metas.iter().any(|meta| meta.groups.contains(&group)),
                    None => metas.iter().any(|meta| meta.name == *tool),
                };
                assert!(known, "{alias} names {tool}, which no tool is");
            }
        }
    }

    #[test]
    fn a_matcher_that_matches_no_tool_is_named() {
        let fs: &[&'static str] = &["fs"];
        let known = KnownTools {
            tools: vec![("shell", &[]), ("write_file", fs), ("lint", &[])],
            mcp_servers: vec!["github"],
        };
        let unmatched = |matcher: &str| tool_hook(matcher).unmatched(&known);
        for fine in [
            "shell",
            "Bash",
            "Edit|Write",
            "sh*",
            "*",
            "",
            "group:fs",
            "lint",
            "group:mcp",
            "group:mcp:github",
            "mcp__github__create_issue",
            "mcp__github__.*",
            "mcp__git*",
            "mc*",
        ] {
            assert_eq!(unmatched(fine), None, "{fine:?}");
        }
        assert_eq!(unmatched("shel"), Some("shel".into()));
        assert_eq!(unmatched("shell|writ_file"), Some("writ_file".into()));
        assert_eq!(unmatched("bash"), Some("bash".into()));
        assert_eq!(unmatched("group:web"), Some("group:web".into()));
        assert_eq!(
            unmatched("group:mcp:gitlab"),
            Some("group:mcp:gitlab".into())
        );
        assert_eq!(unmatched("mcp__gitlab__x"), Some("mcp__gitlab__x".into()));
        assert_eq!(unmatched("mcp__github__"), Some("mcp__github__".into()));
        assert_eq!(unmatched("zz*"), Some("zz*".into()));
        // Events without a tool ignore their matcher.
        let stop = HookConfig {
            event: HookEvent::Stop,
            ..tool_hook("shel")
        };
        assert_eq!(stop.unmatched(&known), None);
    }

    #[test]
    fn a_command_naming_a_script_the_agent_can_rewrite_is_found() {
        let workspace = Path::new("/srv/work");
        let named = |command: &str| {
            HookConfig {
                command: Some(command.into()),
                ..tool_hook("shell")
            }
            .workspace_path(workspace)
        };
        for (command, path) in [
            ("python3 .agents/hooks/check.py", ".agents/hooks/check.py"),
            ("./scripts/guard.sh", "./scripts/guard.sh"),
            ("scripts/guard", "scripts/guard"),
            ("sh -c '../up/guard'", "../up/guard"),
            (
                "/srv/work/hooks/guard.sh --strict",
                "/srv/work/hooks/guard.sh",
            ),
            ("LANG=C /srv/work/guard", "/srv/work/guard"),
            ("jq . | node --config=./hook.json x", "./hook.json"),
        ] {
            assert_eq!(named(command).as_deref(), Some(path), "{command}");
        }
        for command in [
            "/etc/agentd/hooks/check.py",
            "python3 /etc/agentd/hooks/check.py 2>/dev/null",
            "grep -q 'rm -rf' && exit 2",
            "jq -r .tool_input.command",
            "sed 's/a/b/' | check-hook",
            "curl -s https://ci.example.com/hook",
            "/srv/workshop/guard",
            "$HOME/hooks/guard.sh",
        ] {
            assert_eq!(named(command), None, "{command}");
        }
    }

    #[test]
    fn a_hook_is_named_by_its_name_its_command_or_its_urls_host_alone() {
        let url_hook = HookConfig {
            name: None,
            event: HookEvent::Stop,
            matcher: None,
            command: None,
            url: Some("https://hooks.example.com:8443/t/SECRET-PATH?key=SECRET-QUERY#frag".into()),
            secret_env: None,
            timeout_secs: 5,
            secret: None,
        };
        assert_eq!(url_hook.label(), "hooks.example.com");
        let named = HookConfig {
            name: Some("audit".into()),
            ..url_hook.clone()
        };
        assert_eq!(named.label(), "audit");
        let command = HookConfig {
            url: None,
            command: Some("./check.sh".into()),
            ..url_hook.clone()
        };
        assert_eq!(command.label(), "./check.sh");
        let blank = HookConfig {
            name: Some(" ".into()),
            ..url_hook
        };
        assert!(blank.invalid().unwrap().contains("name"));
    }

    #[test]
    fn the_signature_is_the_hmac_sha256_of_the_body() {
        // RFC 4231 test case 2.
        let secret = Secret::new("Jefe".to_string());
        assert_eq!(
            signature(&secret, "what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    /// Set in the child test process that measures its own peak memory.
    const MEMORY_PROBE: &str = "AGENTD_HOOK_MEMORY_PROBE";

    /// A command hook that prints 512 MiB on each stream adds at most its caps to the server:
    /// measured as the peak resident memory of a process that runs this test alone.
    #[tokio::test]
    async fn a_hook_printing_a_gibibyte_costs_its_output_cap() {
        if std::env::var_os(MEMORY_PROBE).is_none() {
            let module = module_path!().split_once("::").unwrap().1;
            let name = format!("{module}::a_hook_printing_a_gibibyte_costs_its_output_cap");
            let probe = tokio::process::Command::new(std::env::current_exe().unwrap())
                .args([name.as_str(), "--exact", "--test-threads=1", "--nocapture"])
                .env(MEMORY_PROBE, "1")
                .kill_on_drop(true)
                .output();
            let probe = tokio::time::timeout(Duration::from_secs(120), probe)
                .await
                .unwrap()
                .unwrap();
            let stdout = String::from_utf8_lossy(&probe.stdout);
            let stderr = String::from_utf8_lossy(&probe.stderr);
            assert!(probe.status.success(), "{stdout}\n{stderr}");
            assert!(
                stdout.contains("1 passed"),
                "the probe did not run: {stdout}"
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("root")).unwrap();
        let workspace = Workspace::new(dir.path().join("root"));
        let command = "head -c 536870912 /dev/zero; head -c 536870912 /dev/zero >&2";
        let hooks: Arc<[HookConfig]> = Arc::new([toml::from_str::<HookConfig>(&format!(
            "event = \"PreToolUse\"\ncommand = {command:?}"
        ))
        .unwrap()]);
        let session = SessionHooks::new(&hooks, Default::default(), workspace, "s").unwrap();
        let answer = session
            .run_command(
                command,
                "{}",
                Duration::from_secs(100),
                &CancellationToken::new(),
            )
            .await;
        let Answer::Exited {
            code: Some(0),
            stdout,
            stderr,
        } = answer
        else {
            panic!("the hook did not run to its end: {answer:?}");
        };
        assert_eq!(
            (stdout.len(), stderr.len()),
            (MAX_OUTPUT_BYTES, MAX_OUTPUT_BYTES)
        );
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let peak_kib: u64 = status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        assert!(peak_kib < 200 * 1024, "peak resident memory {peak_kib} KiB");
    }
}
