//! One typed configuration, built once at start-up from defaults, a TOML file, the environment
//! and flags (in rising priority), then passed down.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand};
use serde::{Deserialize, Serialize};

use crate::builtin::ToolPermissions;
use crate::sandbox::command_env::{CommandEnv, SecretNames};
pub use crate::sandbox::{SandboxConfig, SandboxMode};
use crate::tools::ToolPolicy;
use crate::tools::lifecycle::{DEFAULT_IDLE_THRESHOLD, DEFAULT_MAX_ACTIVE};

pub use crate::secret::Secret;

/// A configuration problem; start-up prints it on one line and exits with code 2.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The config file is not valid TOML for this schema.
    #[error("invalid config file {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, with its location.
        #[source]
        source: TomlError,
    },
    /// A value is out of range or contradicts another.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// Configuration text that is not valid TOML for the schema: what is wrong, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct TomlError {
    /// The 1-based line the problem starts on, when the parser knows it.
    pub line: Option<usize>,
    /// What is wrong, naming the key.
    pub message: String,
}

impl std::fmt::Display for TomlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// `[server]`: where agentd listens and keeps its data.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Listen address.
    pub bind: SocketAddr,
    /// Where the SQLite database and task output live.
    pub data_dir: PathBuf,
    /// The root every session's tools work under.
    pub workspace: PathBuf,
    /// `sqlite://…` or `postgres://…`; default `<data_dir>/agentd.db`.
    pub database_url: Option<Secret>,
    /// One shared bearer token for everything under `/api/`.
    pub auth_token: Option<Secret>,
    /// WebSocket `Origin`s accepted besides the server's own.
    pub allowed_origins: Vec<String>,
    /// Seconds an actor with no connection and no running work stays loaded.
    pub idle_unload_secs: u64,
    /// Seconds shutdown waits for running work before giving up.
    pub shutdown_grace_secs: u64,
    /// Frames a WebSocket connection may have queued (per connection and per watched session)
    /// before a client that is not reading is cut off with close code 1013.
    pub ws_queue_frames: usize,
    /// Named users, each with a token; sessions then belong to a user.
    pub users: Vec<UserConfig>,
    /// Open connections accepted at once; 0 derives it from the file-descriptor limit,
    /// leaving a reserve for the database, task logs and commands.
    pub max_connections: usize,
    /// Seconds a client may take to send its request headers, and that a connection may stay
    /// open without upgrading to a WebSocket or completing a request.
    pub header_timeout_secs: u64,
    /// `tool/invoke` calls one session may have running or queued; beyond it the call is
    /// answered -32001 with `data.kind = "overloaded"`.
    pub max_inflight_per_session: usize,
    /// Sessions one user may have stored, forks included (0: no limit); beyond it
    /// `session/open` and `session/fork` answer `quota_exceeded`.
    pub max_sessions_per_user: u64,
    /// New sessions (opened or forked) one user may make per minute, with as many at once
    /// (0: no limit).
    pub session_creates_per_minute: u32,
    /// Seconds a WebSocket may stay silent before it is pinged; one that then sends no whole
    /// frame for as long again is closed, so a client stalled part-way through a frame is
    /// dropped after at most twice this.
    pub ws_ping_secs: u64,
    /// MiB of free space held back on the data and workspace filesystems for the database
    /// and the event log: a file tool's write, task output or a checkpoint that would leave
    /// less is refused `quota_exceeded` (0: none held back).
    pub min_free_mb: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 8080)),
            data_dir: PathBuf::from("data"),
            workspace: PathBuf::from("workspace"),
            database_url: None,
            auth_token: None,
            allowed_origins: Vec::new(),
            idle_unload_secs: 1800,
            shutdown_grace_secs: 10,
            ws_queue_frames: 256,
            users: Vec::new(),
            max_connections: 0,
            header_timeout_secs: 10,
            max_inflight_per_session: 32,
            max_sessions_per_user: 1000,
            session_creates_per_minute: 600,
            ws_ping_secs: 30,
            min_free_mb: 512,
        }
    }
}

impl ServerConfig {
    /// The database URL in force: the configured one, or SQLite under the data dir.
    pub fn database_url(&self) -> String {
        match &self.database_url {
            Some(url) => url.expose().to_string(),
            None => format!("sqlite://{}", self.data_dir.join("agentd.db").display()),
        }
    }
}

/// `[[server.users]]`: one user and the token that identifies them.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    /// The user's name; also their workspace sub-directory.
    pub name: String,
    /// Their bearer token.
    pub token: Secret,
}

pub use crate::llm::catalog::ModelCard;
pub use crate::llm::pricing::ModelPrice;

/// `[llm]`: the OpenAI-compatible model sessions talk to.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LlmConfig {
    /// Chat completions base URL, such as `https://api.openai.com/v1`.
    pub base_url: Option<String>,
    /// Model id.
    pub model: Option<String>,
    /// Environment variable holding the key when `AGENTD_LLM_API_KEY` is unset.
    pub api_key_env: String,
    /// The key itself; only ever filled from the environment.
    #[serde(skip)]
    pub api_key: Option<Secret>,
    /// Provider name, for `tool_policy_by_provider`.
    pub provider: String,
    /// Completion token cap per call.
    pub max_tokens: u32,
    /// The model's context window in tokens.
    pub context_window: u32,
    /// Share of the context window past which the older conversation is summarised.
    pub compact_at: f64,
    /// Prices and limits by model id, over the embedded catalog's.
    pub pricing: BTreeMap<String, ModelCard>,
    /// Model calls one turn may make before it stops with `iteration_limit`.
    pub max_iterations: u32,
    /// Seconds one turn may run before it stops with `turn_timeout`.
    pub turn_timeout_secs: u64,
    /// Sub-agents one session may have open (not yet closed) at once.
    pub max_sub_agents: usize,
    /// Named providers; models are then named `<provider>/<model>`.
    pub providers: Vec<ProviderConfig>,
}

/// `[[llm.providers]]`: one API endpoint models are reached through.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// The name models are prefixed with (`ds` in `ds/deepseek-v4-flash`).
    pub name: String,
    /// The wire API it speaks.
    #[serde(default)]
    pub kind: crate::llm::ProviderKind,
    /// The API's base URL, such as `https://api.deepseek.com/v1`.
    pub base_url: String,
    /// Environment variable holding its key; by kind, `OPENAI_API_KEY` or `ANTHROPIC_API_KEY`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Models `model/list` offers for it, beside the default and the priced ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// The key itself; only ever filled from the environment.
    #[serde(skip)]
    pub api_key: Option<Secret>,
}

impl ProviderConfig {
    /// The variable its key is read from.
    pub fn key_variable(&self) -> &str {
        match (&self.api_key_env, self.kind) {
            (Some(name), _) => name,
            (None, crate::llm::ProviderKind::Anthropic) => "ANTHROPIC_API_KEY",
            (None, _) => "OPENAI_API_KEY",
        }
    }
}

impl From<&ProviderConfig> for crate::llm::openai::Endpoint {
    fn from(config: &ProviderConfig) -> Self {
        Self {
            base_url: Some(config.base_url.clone()),
            model: None,
            api_key: config.api_key.clone(),
        }
    }
}

impl Default for LlmConfig {
    fn default() -> Self {
        Self {
            base_url: None,
            model: None,
            api_key_env: "OPENAI_API_KEY".to_string(),
            api_key: None,
            provider: "openai".to_string(),
            max_tokens: 4096,
            context_window: 128_000,
            compact_at: 0.8,
            pricing: BTreeMap::new(),
            max_iterations: 50,
            turn_timeout_secs: 1800,
            max_sub_agents: 4,
            providers: Vec::new(),
        }
    }
}

impl LlmConfig {
    /// Whether a model is configured at all; without one `turn/start` answers
    /// `llm_not_configured`.
    pub fn is_configured(&self) -> bool {
        self.model.is_some() && (self.base_url.is_some() || !self.providers.is_empty())
    }
}

/// `[tools]`: the registry's limits and defaults.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolsConfig {
    /// Visible tools before LRU eviction starts.
    pub max_active: usize,
    /// Iterations a tool must be idle before it may be evicted.
    pub idle_threshold: u32,
    /// Cap on one call's serialised arguments.
    pub max_args_bytes: usize,
    /// Tools never evicted or deferred; unset, the tools marked so (the contract's default
    /// list).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_tools: Option<Vec<String>>,
    /// Groups deferred at session start when more than `max_active` tools would be visible.
    pub defer_groups: Vec<String>,
    /// Tools whose calls run in the background.
    pub spawn_only: Vec<String>,
    /// Tags the registry's context filter keeps; empty keeps everything.
    pub context_tags: Vec<String>,
    /// Lets `web_fetch` reach private addresses.
    pub web_fetch_allow_private: bool,
    /// SearXNG-style endpoint for `web_search`.
    pub web_search_url: Option<String>,
    /// How long a call waits for an approval before it is declined.
    pub approval_timeout_secs: u64,
}

impl Default for ToolsConfig {
    fn default() -> Self {
        Self {
            max_active: DEFAULT_MAX_ACTIVE,
            idle_threshold: DEFAULT_IDLE_THRESHOLD,
            max_args_bytes: crate::tools::args::DEFAULT_MAX_ARGS_BYTES,
            base_tools: None,
            defer_groups: vec!["group:web".to_string(), "group:sessions".to_string()],
            spawn_only: vec!["run_pipeline".to_string()],
            context_tags: Vec::new(),
            web_fetch_allow_private: false,
            web_search_url: None,
            approval_timeout_secs: 900,
        }
    }
}

impl ToolsConfig {
    /// What the built-in tools may do beyond the workspace.
    pub fn permissions(&self) -> ToolPermissions {
        ToolPermissions {
            web_fetch_allow_private: self.web_fetch_allow_private,
            web_search_url: self.web_search_url.clone(),
        }
    }
}

pub use crate::plugin::PluginConfig;

/// `[agent]`: how the turn loop guards itself.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// The same call this many times in a row and the model is told; twice as many and the
    /// turn ends `stuck_in_loop`.
    pub max_repeated_calls: u32,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            max_repeated_calls: 3,
        }
    }
}

/// `[cluster]`: several nodes over one PostgreSQL (see `crate::cluster`).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// Whether this node is one of several.
    pub enabled: bool,
    /// This node's name in leases; empty means hostname-pid.
    pub node_id: String,
    /// How the other nodes reach this one.
    pub advertise_url: String,
    /// How long a session's lease lasts unless renewed.
    pub lease_secs: u64,
    /// What the nodes show each other on forwarded requests; `AGENTD_CLUSTER_SECRET` wins.
    pub secret: Secret,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            node_id: String::new(),
            advertise_url: String::new(),
            lease_secs: 10,
            secret: Secret::new(""),
        }
    }
}

impl ClusterConfig {
    /// This node's id: `node_id`, or `<hostname>-<pid>` when unset.
    pub fn node_id(&self) -> String {
        if !self.node_id.is_empty() {
            return self.node_id.clone();
        }
        let host =
            crate::capped_read::read_file_to_string(Path::new("/proc/sys/kernel/hostname"), 256)
                .map(|name| name.trim().to_string())
                .ok()
                .filter(|name| !name.is_empty())
                .unwrap_or_else(|| "agentd".to_string());
        format!("{host}-{}", std::process::id())
    }
}

/// `[budget]`: spending limits.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct BudgetConfig {
    /// Hard cap in USD per session; calls that would pass it are refused.
    pub session_usd: Option<f64>,
    /// Most a session may spend in any minute; a turn spending faster ends
    /// `budget_rate_exceeded`. 0 is off.
    pub usd_per_minute: f64,
}

impl From<&LlmConfig> for crate::llm::openai::Endpoint {
    fn from(config: &LlmConfig) -> Self {
        Self {
            base_url: config.base_url.clone(),
            model: config.model.clone(),
            api_key: config.api_key.clone(),
        }
    }
}

/// `[telemetry]`: where OpenTelemetry spans and metrics go (OTLP over HTTP), if anywhere.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The collector's OTLP/HTTP base URL, e.g. `http://127.0.0.1:4318`; empty: the
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` variable, else export is off.
    pub otlp_endpoint: String,
    /// Whether message content (`gen_ai.input.messages`, …) goes into spans.
    pub capture_content: bool,
}

impl TelemetryConfig {
    /// The settings export starts with.
    pub fn settings(&self) -> crate::telemetry::TelemetrySettings {
        crate::telemetry::TelemetrySettings {
            endpoint: (!self.otlp_endpoint.is_empty()).then(|| self.otlp_endpoint.clone()),
            capture_content: self.capture_content,
        }
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `[server]`.
    pub server: ServerConfig,
    /// `[llm]`.
    pub llm: LlmConfig,
    /// `[tools]`.
    pub tools: ToolsConfig,
    /// `[tool_policy]`: the hard, system-wide policy.
    pub tool_policy: ToolPolicy,
    /// `[tool_policy_by_provider."MODEL-OR-PROVIDER"]`: the soft per-model policies.
    pub tool_policy_by_provider: BTreeMap<String, ToolPolicy>,
    /// `[[plugins]]`.
    pub plugins: Vec<PluginConfig>,
    /// `[[mcp_servers]]`: Model Context Protocol servers whose tools the sessions get.
    pub mcp_servers: Vec<crate::mcp::McpServerConfig>,
    /// `[budget]`.
    pub budget: BudgetConfig,
    /// `[limits]`: totals over all of one user's sessions.
    pub limits: LimitsConfig,
    /// `[retention]`.
    pub retention: crate::session::retention::RetentionConfig,
    /// `[checkpoints]`.
    pub checkpoints: CheckpointsConfig,
    /// `[agent]`.
    pub agent: AgentConfig,
    /// `[cluster]`.
    pub cluster: ClusterConfig,
    /// `[sandbox]`.
    pub sandbox: SandboxConfig,
    /// `[instructions]`: the operator's and the repositories' instructions to the agent.
    pub instructions: crate::session::instructions::InstructionsConfig,
    /// `[[hooks]]`: commands or URLs run around a session's work.
    pub hooks: Vec<crate::agent::hooks::HookConfig>,
    /// `[telemetry]`: OpenTelemetry export.
    pub telemetry: TelemetryConfig,
    /// `[[agents]]`: agent profiles sessions and sub-agents may pick.
    pub agents: Vec<crate::session::profiles::AgentProfile>,
    /// The file this configuration was read from, which sandboxed commands must not read.
    #[serde(skip)]
    pub file: Option<PathBuf>,
}

/// Command line of the `agentd` binary.
#[derive(Debug, Parser)]
#[command(
    name = "agentd",
    version,
    about = "Hosts LLM agent sessions for a browser app",
    // `agentd --bind X serve` would otherwise take the subcommand's own (unset) flags and
    // silently drop X: flags go after `serve`, or without a subcommand at all.
    args_conflicts_with_subcommands = true,
    after_help = "Environment variables that are not flags:\n  \
        AGENTD_LOG            log filter (e.g. info, agentd=debug) [default: info]\n  \
        AGENTD_LOG_FORMAT     text or json [default: text]\n  \
        AGENTD_LLM_API_KEY    the model provider's API key (else the variable llm.api_key_env \
        names, OPENAI_API_KEY by default)\n  \
        AGENTD_CLUSTER_SECRET cluster.secret, shared by the nodes of a cluster"
)]
pub struct Cli {
    /// What to do; `serve` when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Settings for `serve` when no subcommand is given.
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// agentd's subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start the server (the default).
    Serve(ServeArgs),
    /// Read and check the configuration, then print it as it takes effect (secrets masked).
    CheckConfig(ServeArgs),
    /// Bring the database's schema up to date, then exit.
    Migrate(ServeArgs),
    /// Write a consistent copy of the SQLite store to FILE while the server runs (for
    /// PostgreSQL, use pg_dump).
    Backup(BackupArgs),
    /// Apply `[retention]` now: delete old events, old task output and idle sessions.
    Gc(ServeArgs),
    /// Run one task in-process and exit: 0 completed, 1 failed, 2 bad usage or
    /// configuration, 3 stopped by the budget, a policy or a hook.
    Exec(ExecArgs),
    /// Speak the Agent Client Protocol (v1) on stdin/stdout, for editors such as Zed.
    Acp(AcpArgs),
    /// Write a session as JSON Lines to stdout (what `GET /api/sessions/{id}/export` serves).
    Export(ExportArgs),
    /// Make a new session from an export (a file, or `-` for stdin); prints its id.
    Import(ImportArgs),
}

/// `[limits]`: limits over more than one session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// `[limits.user]`.
    pub user: UserLimits,
}

/// `[limits.user]`: totals over all of one user's sessions (each `[[server.users]]` user, or
/// the one implicit user of a server without users); 0 lifts each.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct UserLimits {
    /// MiB of memory the commands of all of the user's sessions hold together.
    pub memory_max_mb: u64,
    /// CPU time their commands get together, in percent of one core.
    pub cpu_max_percent: u32,
    /// Processes their commands keep alive at once.
    pub pids_max: u32,
    /// MiB the user's workspace, task output and checkpoint contents may take; writes past
    /// it, and commands once it is reached, are refused `quota_exceeded`.
    pub disk_max_mb: u64,
}

impl Config {
    /// The disk limits of `[limits.user] disk_max_mb` and `[server] min_free_mb`, free space
    /// read with `statvfs` on the data dir and the workspace (`None`: neither is limited);
    /// says in the log what is enforced.
    pub fn disk_quotas(&self) -> Option<crate::disk_quota::DiskQuotas> {
        let free = crate::disk_quota::Statvfs::new(vec![
            self.server.data_dir.clone(),
            self.server.workspace.clone(),
        ]);
        let quotas = crate::disk_quota::DiskQuotas::new(
            self.limits.user.disk_max_mb,
            self.server.min_free_mb,
            std::sync::Arc::new(free),
        );
        match &quotas {
            Some(quotas) => tracing::info!("disk limits: {}", quotas.describe()),
            None => tracing::info!(
                "disk limits: none (limits.user.disk_max_mb and server.min_free_mb are 0)"
            ),
        }
        quotas
    }
}

/// `[checkpoints]`: what each turn's checkpoint (`turn/diff`, `session/revert`) copies.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointsConfig {
    /// A file larger than this many MiB is neither diffed nor reverted.
    pub max_file_mb: u64,
    /// A checkpoint copies at most this many MiB of a session's workspace; the files past it
    /// are neither diffed nor reverted.
    pub max_total_mb: u64,
}

impl Default for CheckpointsConfig {
    fn default() -> Self {
        Self {
            max_file_mb: 1,
            max_total_mb: 128,
        }
    }
}

impl CheckpointsConfig {
    /// The limits a checkpoint is taken within.
    pub fn limits(&self) -> crate::checkpoint::Limits {
        crate::checkpoint::Limits {
            max_file_bytes: self.max_file_mb.saturating_mul(1024 * 1024),
            max_total_bytes: self.max_total_mb.saturating_mul(1024 * 1024),
            ..crate::checkpoint::Limits::default()
        }
    }
}

/// `agentd export SESSION_ID`.
#[derive(Clone, Debug, Args)]
pub struct ExportArgs {
    /// The session.
    pub session_id: String,
    /// Carry the session's checkpoints too (the file contents its undo needs).
    #[arg(long)]
    pub checkpoints: bool,
    /// Whose session it is, on a server with `[[server.users]]`.
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    /// Settings, as for `serve`.
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// `agentd import FILE`.
#[derive(Clone, Debug, Args)]
pub struct ImportArgs {
    /// The export to read; `-` reads stdin.
    pub file: PathBuf,
    /// Whose session the new one is, on a server with `[[server.users]]`.
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    /// Settings, as for `serve`.
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// `agentd acp`: where the sessions run.
#[derive(Clone, Debug, Args)]
pub struct AcpArgs {
    /// Bridge to the running agentd whose WebSocket is this URL (`ws://HOST:PORT/api/ws`)
    /// instead of hosting the sessions in-process; `--workspace` (or the config's) is that
    /// server's workspace root as seen here, so ACP's absolute `cwd`s can be made relative.
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// The file holding the bearer token for `--url`.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// In-process: the `[[server.users]]` user whose sessions and workspace root are served
    /// (required when users are configured).
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    /// Settings, as for `serve`.
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// `agentd exec`: the task and how to report it.
#[derive(Clone, Debug, Args)]
pub struct ExecArgs {
    /// The prompt; read from stdin when omitted or `-`.
    pub prompt: Option<String>,
    /// One JSON object per line on stdout: a `session` line, then every notification.
    #[arg(long)]
    pub json: bool,
    /// The model, `<provider>/<model>` (default: `[llm] model`).
    #[arg(long)]
    pub model: Option<String>,
    /// A JSON Schema file the final answer must validate against.
    #[arg(long, value_name = "FILE")]
    pub output_schema: Option<PathBuf>,
    /// The session's directory, relative to the workspace.
    #[arg(long)]
    pub cwd: Option<String>,
    /// Calls that would ask for approval: `never` declines them, `all` runs them.
    #[arg(long, value_parser = ["never", "all"], default_value = "never")]
    pub approve: String,
    /// Settings, as for `serve`.
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// `agentd backup FILE`: where the copy goes, and the settings naming the store.
#[derive(Clone, Args)]
pub struct BackupArgs {
    /// The file to write; it must not exist yet.
    pub file: PathBuf,
    /// Settings naming the store, as for `serve`.
    #[command(flatten)]
    pub serve: ServeArgs,
}

impl std::fmt::Debug for BackupArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackupArgs")
            .field("file", &self.file)
            .field("serve", &self.serve)
            .finish()
    }
}

/// Flags (and their environment variables) that override the config file.
#[derive(Clone, Default, Args)]
pub struct ServeArgs {
    /// TOML config file.
    #[arg(long, env = "AGENTD_CONFIG")]
    pub config: Option<PathBuf>,
    /// Listen address [default: 127.0.0.1:8080].
    #[arg(long, env = "AGENTD_BIND")]
    pub bind: Option<SocketAddr>,
    /// Data directory [default: data].
    #[arg(long, env = "AGENTD_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Workspace root [default: workspace].
    #[arg(long, env = "AGENTD_WORKSPACE")]
    pub workspace: Option<PathBuf>,
    /// Database URL, `sqlite://…` or `postgres://…` [default: sqlite://<data dir>/agentd.db].
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Chat completions base URL.
    #[arg(long, env = "AGENTD_LLM_BASE_URL")]
    pub llm_base_url: Option<String>,
    /// Model id.
    #[arg(long, env = "AGENTD_LLM_MODEL")]
    pub llm_model: Option<String>,
    /// Bearer token for the API.
    #[arg(long, env = "AGENTD_AUTH_TOKEN", hide_env_values = true)]
    pub auth_token: Option<String>,
}

impl std::fmt::Debug for ServeArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |set: bool| {
            if set {
                Some(crate::secret::REDACTED)
            } else {
                None
            }
        };
        f.debug_struct("ServeArgs")
            .field("config", &self.config)
            .field("bind", &self.bind)
            .field("data_dir", &self.data_dir)
            .field("workspace", &self.workspace)
            .field("database_url", &redacted(self.database_url.is_some()))
            .field("llm_base_url", &self.llm_base_url)
            .field("llm_model", &self.llm_model)
            .field("auth_token", &redacted(self.auth_token.is_some()))
            .finish()
    }
}

/// An override that was given but empty (such as `FOO=` in a compose file) means "not set".
fn given(value: &Option<String>) -> Option<&String> {
    value.as_ref().filter(|v| !v.trim().is_empty())
}

impl Config {
    /// The configuration as it takes effect (`agentd check-config`), as TOML that reads back into
    /// the same configuration but for its secrets, which show as `[redacted]`; a few comment
    /// lines say where it came from and what it leaves implicit.
    pub fn to_effective_toml(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let source = match &self.file {
            Some(path) => format!("the file {}", path.display()),
            None => "no file".to_string(),
        };
        let _ = writeln!(
            out,
            "# agentd's configuration as it takes effect: defaults, {source}, the environment \
             and flags.\n# Secrets show as \"{}\": put the real ones back before using this as a file.",
            crate::secret::REDACTED
        );
        if self.server.database_url.is_none() {
            let _ = writeln!(
                out,
                "# server.database_url is unset: the database is {}.",
                self.server.database_url()
            );
        }
        let _ = writeln!(
            out,
            "# The model API key comes only from the environment: {}.\n",
            if self.llm.api_key.is_some() {
                "set"
            } else {
                "not set"
            }
        );
        match toml::to_string_pretty(self) {
            Ok(body) => out.push_str(&body),
            // Whatever was read from TOML writes back as TOML; were that ever not so, the
            // command still shows the configuration rather than failing.
            Err(err) => {
                let _ = writeln!(
                    out,
                    "# Not expressible as TOML ({err}); as read:\n{self:#?}"
                );
            }
        }
        out
    }

    /// Builds the configuration: defaults, then the file, then environment and flags (which
    /// clap has already merged, flags winning), then the API key from the environment.
    pub fn load(
        args: &ServeArgs,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut config = match &args.config {
            Some(path) => Self::from_file(path)?,
            None => Self::default(),
        };
        config.file = args.config.clone();
        if let Some(bind) = args.bind {
            config.server.bind = bind;
        }
        if let Some(dir) = &args.data_dir {
            config.server.data_dir = dir.clone();
        }
        if let Some(dir) = &args.workspace {
            config.server.workspace = dir.clone();
        }
        if let Some(url) = given(&args.database_url) {
            config.server.database_url = Some(Secret::new(url.clone()));
        }
        if let Some(url) = given(&args.llm_base_url) {
            config.llm.base_url = Some(url.clone());
        }
        if let Some(model) = given(&args.llm_model) {
            config.llm.model = Some(model.clone());
        }
        if let Some(token) = given(&args.auth_token) {
            config.server.auth_token = Some(Secret::new(token.clone()));
        }
        // A plugin's relative command (with a '/') means relative to the config file, not to
        // whatever directory a session's tools run in.
        if let Some(dir) = args.config.as_deref().and_then(Path::parent) {
            let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
            for plugin in &mut config.plugins {
                let command = Path::new(&plugin.command);
                if plugin.command.contains('/') && command.is_relative() {
                    plugin.command = dir.join(command).to_string_lossy().into_owned();
                }
            }
        }
        config.llm.api_key = env("AGENTD_LLM_API_KEY")
            .or_else(|| env(&config.llm.api_key_env))
            .filter(|key| !key.is_empty())
            .map(Secret::new);
        for provider in &mut config.llm.providers {
            provider.api_key = env(provider.key_variable())
                .filter(|key| !key.is_empty())
                .map(Secret::new);
        }
        if let Some(secret) = env("AGENTD_CLUSTER_SECRET").filter(|s| !s.is_empty()) {
            config.cluster.secret = Secret::new(secret);
        }
        for hook in &mut config.hooks {
            if let Some(name) = &hook.secret_env {
                let secret = env(name).filter(|s| !s.is_empty()).ok_or_else(|| {
                    ConfigError::Invalid(format!(
                        "hooks: secret_env {name:?} names an unset environment variable"
                    ))
                })?;
                hook.secret = Some(Secret::new(secret));
            }
        }
        config.resolve_paths()?;
        config.validate()?;
        Ok(config)
    }

    /// Makes a relative `data_dir` and `workspace` absolute against the current directory,
    /// once: the sandbox launcher, plugins, MCP servers and tasks all start in other
    /// directories, where a relative path would name something else or nothing.
    fn resolve_paths(&mut self) -> Result<(), ConfigError> {
        for (key, path) in [
            ("server.data_dir", &mut self.server.data_dir),
            ("server.workspace", &mut self.server.workspace),
        ] {
            if path.as_os_str().is_empty() {
                return Err(ConfigError::Invalid(format!("{key} must not be empty")));
            }
            if path.is_relative() {
                *path = std::path::absolute(&*path).map_err(|err| {
                    ConfigError::Invalid(format!(
                        "{key} {} cannot be made absolute: {err}",
                        path.display()
                    ))
                })?;
            }
        }
        Ok(())
    }

    /// Parses a TOML file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        // An operator's file, but read like any other: a config is kilobytes.
        let text =
            crate::capped_read::read_file_to_string(path, 16 * 1024 * 1024).map_err(|source| {
                ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
        Self::from_toml(&text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Parses TOML text; the error is one line naming the key and location.
    pub fn from_toml(text: &str) -> Result<Self, TomlError> {
        toml::from_str(text).map_err(|err| TomlError {
            // Counting newlines, not `lines()`: a span that starts a line would otherwise be
            // reported on the line before it.
            line: err.span().map(|span| {
                let before = &text.as_bytes()[..span.start.min(text.len())];
                before.iter().filter(|&&b| b == b'\n').count() + 1
            }),
            message: err.message().to_string(),
        })
    }

    /// `[[llm.providers]]`: unique plain names, http(s) URLs, and a default model that names
    /// one of them.
    fn validate_providers(&self) -> Result<(), ConfigError> {
        let invalid = |msg: String| Err(ConfigError::Invalid(msg));
        let providers = &self.llm.providers;
        let mut names: Vec<&str> = Vec::new();
        for provider in providers {
            let name = provider.name.as_str();
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return invalid(format!(
                    "llm.providers: name {name:?} must be letters, digits, - or _"
                ));
            }
            if names.contains(&name) || (name == "default" && self.llm.base_url.is_some()) {
                return invalid(format!("llm.providers: the name {name:?} is used twice"));
            }
            names.push(name);
            if !(provider.base_url.starts_with("http://")
                || provider.base_url.starts_with("https://"))
            {
                return invalid(format!(
                    "llm.providers {name:?}: base_url {:?} must start with http:// or https://",
                    provider.base_url
                ));
            }
        }
        if providers.is_empty() {
            return Ok(());
        }
        let Some(model) = &self.llm.model else {
            return invalid(format!(
                "llm.model must name the default model as \"<provider>/<model>\" (providers: {})",
                names.join(", ")
            ));
        };
        let prefix = model.split_once('/').map(|(p, _)| p);
        if self.llm.base_url.is_none() && !prefix.is_some_and(|p| names.contains(&p)) {
            return invalid(format!(
                "llm.model {model:?} must be \"<provider>/<model>\" with a configured provider: {}",
                names.join(", ")
            ));
        }
        Ok(())
    }

    /// Every environment variable this configuration reads a secret from: each `*_env` key
    /// anywhere in it (found by walking the whole configuration, so a key added later is
    /// covered too), each provider's key variable, and the server's own secret variables.
    pub fn secret_env_names(&self) -> SecretNames {
        fn walk(value: &serde_json::Value, key: Option<&str>, found: &mut Vec<String>) {
            let named = key.is_some_and(|key| key.ends_with("_env"));
            match value {
                serde_json::Value::String(name) if named => found.push(name.clone()),
                serde_json::Value::Array(items) => {
                    for item in items {
                        walk(item, key, found);
                    }
                }
                serde_json::Value::Object(fields) => {
                    for (key, value) in fields {
                        walk(value, Some(key), found);
                    }
                }
                _ => {}
            }
        }
        let mut found = Vec::new();
        match serde_json::to_value(self) {
            Ok(value) => walk(&value, None, &mut found),
            // Nothing in Config fails to serialise (check-config prints it); were that ever
            // not so, the named keys below still hold.
            Err(err) => tracing::warn!(%err, "the configuration did not serialise"),
        }
        found.push(self.llm.api_key_env.clone());
        found.extend(
            self.llm
                .providers
                .iter()
                .map(|p| p.key_variable().to_string()),
        );
        found.extend(
            self.mcp_servers
                .iter()
                .filter_map(|s| s.bearer_token_env.clone()),
        );
        found.extend(self.hooks.iter().filter_map(|h| h.secret_env.clone()));
        SecretNames::new(found)
    }

    /// The environment every command, hook, plugin and MCP stdio server gets, built from the
    /// server's own environment once, at start-up.
    pub fn command_env(&self) -> CommandEnv {
        self.command_env_from(std::env::vars_os())
    }

    /// [`Config::command_env`] from the environment `source`.
    pub fn command_env_from(
        &self,
        source: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
    ) -> CommandEnv {
        CommandEnv::build(
            source,
            &self.sandbox.env_pass,
            &self.sandbox.env_set,
            &self.secret_env_names(),
        )
    }

    /// The tools a session of this server can be offered, for checking hook matchers: the
    /// built-ins, the server's task tools, the plugins, and the MCP servers by name.
    fn known_tools(&self) -> crate::agent::hooks::KnownTools<'_> {
        let own = crate::builtin::metas()
            .iter()
            .chain(crate::tasks::tools::metas())
            .map(|meta| (meta.name.as_str(), meta.groups.as_slice()));
        let plugins = self
            .plugins
            .iter()
            .map(|plugin| (plugin.name.as_str(), &[][..]));
        crate::agent::hooks::KnownTools {
            tools: own.chain(plugins).collect(),
            mcp_servers: self.mcp_servers.iter().map(|s| s.name.as_str()).collect(),
        }
    }

    /// What is allowed but probably not meant, one line each (`check-config` prints them,
    /// `serve` logs them): a hook whose command names a script the agent could rewrite.
    pub fn warnings(&self) -> Vec<String> {
        self.hooks
            .iter()
            .enumerate()
            .filter_map(|(index, hook)| {
                let path = hook.workspace_path(&self.server.workspace)?;
                Some(format!(
                    "hooks[{index}] ({}): its command names {path:?}, inside the workspace or \
                     relative to the session's cwd, where the agent it checks can rewrite it; \
                     keep hook scripts outside the workspace (e.g. /etc/agentd/hooks/)",
                    hook.event.as_str()
                ))
            })
            .collect()
    }

    /// Checks values that parse but make no sense.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |msg: String| Err(ConfigError::Invalid(msg));
        if self.checkpoints.max_file_mb == 0 || self.checkpoints.max_total_mb == 0 {
            return invalid(
                "checkpoints.max_file_mb and checkpoints.max_total_mb must be at least 1".into(),
            );
        }
        if self.checkpoints.max_file_mb > self.checkpoints.max_total_mb {
            return invalid(format!(
                "checkpoints.max_file_mb ({}) is larger than checkpoints.max_total_mb ({})",
                self.checkpoints.max_file_mb, self.checkpoints.max_total_mb
            ));
        }
        if self.tools.max_active == 0 {
            return invalid("tools.max_active must be at least 1".into());
        }
        if self.llm.max_tokens == 0 {
            return invalid("llm.max_tokens must be at least 1".into());
        }
        if self.server.ws_queue_frames == 0 {
            return invalid("server.ws_queue_frames must be at least 1".into());
        }
        if self.server.header_timeout_secs == 0 {
            return invalid("server.header_timeout_secs must be at least 1".into());
        }
        if self.server.max_inflight_per_session == 0 {
            return invalid("server.max_inflight_per_session must be at least 1".into());
        }
        if self.server.ws_ping_secs == 0 {
            return invalid("server.ws_ping_secs must be at least 1".into());
        }
        if self.sandbox.max_processes == 0 {
            return invalid("sandbox.max_processes must be at least 1".into());
        }
        if self.sandbox.memory_max_mb != 0 && self.sandbox.memory_max_mb < 32 {
            return invalid(format!(
                "sandbox.memory_max_mb must be 0 (a quarter of the machine's memory, at most \
                 4096) or at least 32, not {}",
                self.sandbox.memory_max_mb
            ));
        }
        if self.sandbox.cpu_max_percent == 0 {
            return invalid("sandbox.cpu_max_percent must be at least 1 (100 = one core)".into());
        }
        // Named by the contract, not yet enforced: a cap that would silently do nothing is
        // refused, so nobody believes a user's sessions are held to it.
        let user = &self.limits.user;
        for (key, value) in [
            ("memory_max_mb", user.memory_max_mb),
            ("cpu_max_percent", u64::from(user.cpu_max_percent)),
            ("pids_max", u64::from(user.pids_max)),
        ] {
            if value != 0 {
                return invalid(format!(
                    "limits.user.{key} is not enforced by this version (only disk_max_mb is); \
                     leave it 0 and use the per-session [sandbox] caps"
                ));
            }
        }
        for path in self
            .sandbox
            .extra_read
            .iter()
            .chain(&self.sandbox.extra_write)
        {
            if !path.is_absolute() {
                return invalid(format!(
                    "sandbox.extra_read and extra_write take absolute paths, not {}",
                    path.display()
                ));
            }
        }
        if let Some(problem) = crate::sandbox::command_env::configuration_problem(
            &self.sandbox.env_pass,
            &self.sandbox.env_set,
            &self.secret_env_names(),
        ) {
            return invalid(problem);
        }
        if self.tools.max_args_bytes < 2 {
            return invalid("tools.max_args_bytes must be at least 2".into());
        }
        if self.llm.providers.is_empty() && self.llm.base_url.is_some() != self.llm.model.is_some()
        {
            return invalid("llm.base_url and llm.model must be set together".into());
        }
        self.validate_providers()?;
        crate::session::profiles::validate(&self.agents)
            .map_err(|err| ConfigError::Invalid(err.to_string()))?;
        let otlp = &self.telemetry.otlp_endpoint;
        if !(otlp.is_empty() || otlp.starts_with("http://") || otlp.starts_with("https://")) {
            return invalid(format!(
                "telemetry.otlp_endpoint {otlp:?} must start with http:// or https:// (the \
                 collector's OTLP/HTTP base URL, e.g. http://127.0.0.1:4318)"
            ));
        }
        if let Some(url) = &self.llm.base_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return invalid(format!(
                "llm.base_url {url:?} must start with http:// or https://"
            ));
        }
        let url = self.server.database_url();
        if !(url.starts_with("sqlite:")
            || url.starts_with("postgres://")
            || url.starts_with("postgresql://"))
        {
            return invalid("database_url must start with sqlite: or postgres://".into());
        }
        if self
            .server
            .auth_token
            .as_ref()
            .is_some_and(|t| t.expose().is_empty())
        {
            return invalid("server.auth_token is empty; remove it or set a token".into());
        }
        if self.llm.max_iterations == 0 {
            return invalid("llm.max_iterations must be at least 1".into());
        }
        let known = self.known_tools();
        for (index, hook) in self.hooks.iter().enumerate() {
            if let Some(problem) = hook.invalid() {
                return invalid(format!(
                    "hooks[{index}] ({}): {problem}",
                    hook.event.as_str()
                ));
            }
            if let Some(entry) = hook.unmatched(&known) {
                return invalid(format!(
                    "hooks[{index}] ({} {:?}): the matcher {:?} names no tool this server \
                     offers ({entry:?} matches none: use a tool name, a Claude Code tool name \
                     such as Bash, a wildcard, or group:NAME)",
                    hook.event.as_str(),
                    hook.label(),
                    hook.matcher.as_deref().unwrap_or_default(),
                ));
            }
        }
        for (model, card) in &self.llm.pricing {
            if let Some(problem) = card.invalid() {
                return invalid(format!("llm.pricing.{model:?}: {problem}"));
            }
        }
        let mut tokens = std::collections::BTreeSet::new();
        for user in &self.server.users {
            if !tokens.insert(user.token.expose()) {
                return invalid(format!(
                    "user {:?} has the same token as another user",
                    user.name
                ));
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for user in &self.server.users {
            let valid = !user.name.is_empty()
                && user
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            if !valid {
                return invalid(format!(
                    "user name {:?} must be letters, digits, '-' or '_' (it names a directory)",
                    user.name
                ));
            }
            if !names.insert(&user.name) {
                return invalid(format!("user {:?} is listed twice", user.name));
            }
            if user.token.expose().is_empty() {
                return invalid(format!("user {:?} has an empty token", user.name));
            }
        }
        for plugin in &self.plugins {
            if plugin.name.is_empty() || plugin.command.is_empty() {
                return invalid("every [[plugins]] entry needs a name and a command".into());
            }
        }
        let mut servers = std::collections::HashSet::new();
        for server in &self.mcp_servers {
            if let Some(problem) = server.problem() {
                return invalid(problem);
            }
            if !servers.insert(&server.name) {
                return invalid(format!("mcp_servers: {:?} is listed twice", server.name));
            }
        }
        if let Some(limit) = self.budget.session_usd
            && !(limit.is_finite() && limit >= 0.0)
        {
            return invalid("budget.session_usd must be a non-negative number".into());
        }
        if !(self.budget.usd_per_minute.is_finite() && self.budget.usd_per_minute >= 0.0) {
            return invalid("budget.usd_per_minute must be a non-negative number (0: off)".into());
        }
        if self.cluster.enabled {
            let url = self.server.database_url();
            if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                return invalid(
                    "cluster.enabled needs PostgreSQL: set server.database_url to a postgres:// \
                     URL (SQLite is one node's file)"
                        .into(),
                );
            }
            if self.cluster.lease_secs == 0 {
                return invalid("cluster.lease_secs must be at least 1".into());
            }
            if self.cluster.advertise_url.is_empty() {
                return invalid(
                    "cluster.advertise_url must say how the other nodes reach this one".into(),
                );
            }
            if self.cluster.secret.expose().len() < 16 {
                return invalid(
                    "cluster.secret (or AGENTD_CLUSTER_SECRET) must be set, 16 characters or more, \
                     the same on every node"
                        .into(),
                );
            }
        }
        if !(self.llm.compact_at > 0.0 && self.llm.compact_at <= 1.0) {
            return invalid(format!(
                "llm.compact_at must be above 0 and at most 1 (a share of llm.context_window), not {}",
                self.llm.compact_at
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn defaults_match_the_contract() {
        let config = Config::load(&ServeArgs::default(), &no_env).unwrap();
        assert_eq!(config.server.bind, "127.0.0.1:8080".parse().unwrap());
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            config.server.database_url(),
            format!("sqlite://{}", cwd.join("data/agentd.db").display())
        );
        assert_eq!(config.server.workspace, cwd.join("workspace"));
        assert_eq!(config.server.data_dir, cwd.join("data"));
        assert_eq!(config.server.idle_unload_secs, 1800);
        assert_eq!(config.tools.max_active, 15);
        assert_eq!(config.tools.idle_threshold, 5);
        assert_eq!(config.tools.max_args_bytes, 1_048_576);
        assert_eq!(config.tools.base_tools, None, "the tools' own marks decide");
        assert_eq!(config.tools.defer_groups, ["group:web", "group:sessions"]);
        assert_eq!(config.tools.spawn_only, ["run_pipeline"]);
        assert!(!config.llm.is_configured());
        assert_eq!(config.llm.max_sub_agents, 4);
        assert_eq!(config.server.max_connections, 0);
        assert_eq!(config.server.header_timeout_secs, 10);
        assert_eq!(config.server.max_inflight_per_session, 32);
        assert_eq!(config.server.ws_ping_secs, 30);
        assert_eq!(config.sandbox.mode, SandboxMode::WorkspaceWrite);
        assert!(!config.sandbox.network);
        assert_eq!(config.sandbox.max_processes, 256);
        assert_eq!(config.llm.compact_at, 0.8);
        assert_eq!(config.budget.usd_per_minute, 0.0, "the rate guard is off");
    }

    #[test]
    fn the_file_then_env_and_flags_override_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agentd.toml");
        std::fs::write(
            &path,
            r#"
[server]
bind = "0.0.0.0:9000"
data_dir = "/var/lib/agentd"
[llm]
base_url = "http://127.0.0.1:1/v1"
model = "file-model"
api_key_env = "MY_KEY"
max_sub_agents = 2
compact_at = 0.5
[llm.pricing."file-model"]
input_per_mtok = 2.5
output_per_mtok = 10.0
cached_input_per_mtok = 0.25
images = false
context_window = 32000
[tools]
max_active = 9
[tool_policy]
deny = ["web_*"]
[tool_policy_by_provider.openai]
deny = ["shell"]
[[plugins]]
name = "lint"
description = "runs the linter"
command = "/usr/bin/true"
[budget]
session_usd = 5.0
usd_per_minute = 0.5
"#,
        )
        .unwrap();
        let args = ServeArgs {
            config: Some(path),
            llm_model: Some("flag-model".into()),
            ..ServeArgs::default()
        };
        let env = |name: &str| (name == "MY_KEY").then(|| "sk-test".to_string());
        let config = Config::load(&args, &env).unwrap();
        assert_eq!(config.server.bind, "0.0.0.0:9000".parse().unwrap());
        assert_eq!(
            config.server.database_url(),
            "sqlite:///var/lib/agentd/agentd.db"
        );
        assert_eq!(config.llm.model.as_deref(), Some("flag-model"));
        assert_eq!(
            config.llm.api_key.as_ref().map(Secret::expose),
            Some("sk-test")
        );
        assert_eq!(config.llm.pricing["file-model"].output_per_mtok, Some(10.0));
        assert_eq!(config.llm.pricing["file-model"].images, Some(false));
        assert_eq!(config.llm.pricing["file-model"].context_window, Some(32000));
        assert_eq!(config.llm.max_sub_agents, 2);
        assert_eq!(config.tools.max_active, 9);
        assert_eq!(config.tools.idle_threshold, 5, "unset keys keep defaults");
        assert_eq!(config.tool_policy.deny, ["web_*"]);
        assert_eq!(config.tool_policy_by_provider["openai"].deny, ["shell"]);
        assert!(config.plugins[0].exclusive);
        assert_eq!(config.plugins[0].timeout_ms, 600_000);
        assert_eq!(config.budget.session_usd, Some(5.0));
        assert_eq!(config.budget.usd_per_minute, 0.5);
        assert_eq!(config.llm.compact_at, 0.5);
        assert_eq!(
            config.llm.pricing["file-model"].cached_input_per_mtok,
            Some(0.25)
        );
    }

    #[test]
    fn cluster_mode_needs_postgres_an_advertised_url_and_a_secret() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agentd.toml");
        let load = |text: &str| {
            std::fs::write(&path, text).unwrap();
            let args = ServeArgs {
                config: Some(path.clone()),
                ..ServeArgs::default()
            };
            Config::load(&args, &|_: &str| None)
        };
        let err = load("[cluster]\nenabled = true\nadvertise_url = \"http://10.0.0.2:8080\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("cluster.enabled needs PostgreSQL"), "{err}");
        let postgres =
            "[server]\ndatabase_url = \"postgres://db/agentd\"\n[cluster]\nenabled = true\n";
        let err = load(postgres).unwrap_err().to_string();
        assert!(err.contains("cluster.advertise_url"), "{err}");
        let advertised = format!("{postgres}advertise_url = \"http://10.0.0.2:8080\"\n");
        let err = load(&advertised).unwrap_err().to_string();
        assert!(err.contains("cluster.secret"), "{err}");
        let config = load(&format!(
            "{advertised}lease_secs = 3\nsecret = \"0123456789abcdef\"\n"
        ))
        .unwrap();
        assert!(config.cluster.enabled);
        assert_eq!(config.cluster.lease_secs, 3);
        assert!(
            config
                .cluster
                .node_id()
                .ends_with(&format!("-{}", std::process::id())),
            "{}",
            config.cluster.node_id()
        );
        let default = ClusterConfig::default();
        assert!(!default.enabled);
        assert_eq!(default.lease_secs, 10);
    }

    #[test]
    fn the_agentd_key_wins_over_the_fallback() {
        let env = |name: &str| match name {
            "AGENTD_LLM_API_KEY" => Some("agentd".to_string()),
            "OPENAI_API_KEY" => Some("openai".to_string()),
            _ => None,
        };
        let config = Config::load(&ServeArgs::default(), &env).unwrap();
        assert_eq!(config.llm.api_key.unwrap().expose(), "agentd");
        let env = |name: &str| (name == "OPENAI_API_KEY").then(|| "openai".to_string());
        let config = Config::load(&ServeArgs::default(), &env).unwrap();
        assert_eq!(config.llm.api_key.unwrap().expose(), "openai");
    }

    #[test]
    fn secrets_never_show_in_debug() {
        let args = ServeArgs {
            auth_token: Some("tok-123".into()),
            database_url: Some("postgres://u:pw-456@h/db".into()),
            ..ServeArgs::default()
        };
        let env = |name: &str| (name == "OPENAI_API_KEY").then(|| "sk-789".to_string());
        let shown = format!("{:?}", Config::load(&args, &env).unwrap());
        for secret in ["tok-123", "pw-456", "sk-789"] {
            assert!(!shown.contains(secret), "{secret} leaked: {shown}");
        }
    }

    #[test]
    fn bad_files_and_values_are_one_clear_line() {
        let err = Config::from_toml("[server]\nbind = 12\n").unwrap_err();
        assert_eq!(err.line, Some(2));
        let err = err.to_string();
        assert!(err.starts_with("line 2:"), "{err}");
        assert!(!err.contains('\n'), "{err}");
        let err = Config::from_toml("[tools]\nmax_actve = 3\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_actve"), "{err}");
        // An unknown key's span starts its line: it is named on that line, not the one before.
        let err = Config::from_toml("[server]\nbind = \"127.0.0.1:1\"\nbindd = 1\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("line 3:"), "{err}");
        assert!(err.contains("bindd"), "{err}");
        let mut config = Config::default();
        config.tools.max_active = 0;
        assert!(config.validate().is_err());
        let mut config = Config::default();
        config.sandbox.memory_max_mb = 8;
        let err = config.validate().unwrap_err().to_string();
        assert!(
            err.contains("sandbox.memory_max_mb") && err.contains("not 8"),
            "{err}"
        );
        let mut config = Config::default();
        config.sandbox.cpu_max_percent = 0;
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("sandbox.cpu_max_percent"), "{err}");
        let mut config = Config::default();
        config.limits.user.pids_max = 100;
        let err = config.validate().unwrap_err().to_string();
        assert!(
            err.contains("limits.user.pids_max is not enforced"),
            "{err}"
        );
        let config =
            Config::from_toml("[telemetry]\notlp_endpoint = \"collector:4318\"\n").unwrap();
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("telemetry.otlp_endpoint"), "{err}");
        let config =
            Config::from_toml("[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318\"\n").unwrap();
        assert!(config.validate().is_ok());
        let default_memory = Config::default().sandbox.memory_max_mb_or_default();
        assert!((64..=4096).contains(&default_memory), "{default_memory}");
        let mut config = Config::default();
        config.llm.base_url = Some("http://x/v1".into());
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("together")
        );
        let mut config =
            Config::from_toml("[[server.users]]\nname = \"../x\"\ntoken = \"t\"\n").unwrap();
        assert!(config.validate().is_err());
        config.server.users.clear();
        config.server.database_url = Some(Secret::new("mysql://x"));
        assert!(config.validate().is_err());
        let missing = Config::from_file(Path::new("/nonexistent/agentd.toml")).unwrap_err();
        assert!(missing.to_string().contains("/nonexistent/agentd.toml"));
    }

    #[test]
    fn the_command_line_parses_serve_and_bare_forms() {
        let cli = Cli::try_parse_from(["agentd", "serve", "--bind", "127.0.0.1:0"]).unwrap();
        match cli.command {
            Some(Command::Serve(args)) => {
                assert_eq!(args.bind, Some("127.0.0.1:0".parse().unwrap()))
            }
            other => panic!("serve expected, got {other:?}"),
        }
        let cli = Cli::try_parse_from(["agentd", "--workspace", "/w"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.serve.workspace, Some(PathBuf::from("/w")));
        assert!(Cli::try_parse_from(["agentd", "--bind", "nope"]).is_err());
        // A flag before the subcommand would be dropped; it is refused instead.
        assert!(Cli::try_parse_from(["agentd", "--bind", "127.0.0.1:0", "serve"]).is_err());
        let cli = Cli::try_parse_from(["agentd", "check-config", "--workspace", "/w"]).unwrap();
        assert!(
            matches!(cli.command, Some(Command::CheckConfig(args)) if args.workspace.is_some())
        );
        let cli = Cli::try_parse_from(["agentd", "migrate"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Migrate(_))));
    }

    /// A configuration naming secrets under innocuous names, in every kind of `*_env` key.
    const SECRETS_NAMED: &str = r#"
[llm]
api_key_env = "ALPHA_PROVIDER_CRED"
model = "zeta/m"
[[llm.providers]]
name = "zeta"
base_url = "http://127.0.0.1:9"
api_key_env = "ZETA_PROVIDER_CRED"
[[llm.providers]]
name = "anthro"
kind = "anthropic"
base_url = "http://127.0.0.1:9"
[[mcp_servers]]
name = "remote"
url = "http://127.0.0.1:9/mcp"
bearer_token_env = "MCP_REMOTE_BEARER"
[[hooks]]
event = "Stop"
url = "http://127.0.0.1:9/hook"
secret_env = "HOOK_SIGNING_WORD"
"#;

    #[test]
    fn every_env_key_of_the_configuration_names_a_secret() {
        let config = Config::from_toml(SECRETS_NAMED).unwrap();
        let secrets = config.secret_env_names();
        for name in [
            "ALPHA_PROVIDER_CRED",
            "ZETA_PROVIDER_CRED",
            "ANTHROPIC_API_KEY",
            "MCP_REMOTE_BEARER",
            "HOOK_SIGNING_WORD",
            "OTEL_EXPORTER_OTLP_HEADERS",
            "AGENTD_LLM_API_KEY",
            "AGENTD_AUTH_TOKEN",
            "AGENTD_CLUSTER_SECRET",
            "DATABASE_URL",
        ] {
            assert!(secrets.contains(name), "{name}");
        }
        assert!(!secrets.contains("FOO_VISIBLE"));

        // Built from a server environment holding them all, the command environment has none.
        let source = [
            "ALPHA_PROVIDER_CRED",
            "ZETA_PROVIDER_CRED",
            "MCP_REMOTE_BEARER",
            "HOOK_SIGNING_WORD",
            "OTEL_EXPORTER_OTLP_HEADERS",
            "FOO_VISIBLE",
            "PATH",
        ]
        .map(|name| (name.into(), format!("value-of-{name}").into()));
        let env = config.command_env_from(source);
        let names: Vec<_> = env.vars().iter().map(|(name, _)| name.clone()).collect();
        assert_eq!(
            names,
            ["GIT_PAGER", "NO_COLOR", "PAGER", "PATH", "TERM"].map(std::ffi::OsString::from)
        );
    }

    #[test]
    fn env_pass_or_env_set_naming_a_secret_fails_validation() {
        for (key, name) in [
            ("env_pass", "ZETA_PROVIDER_CRED"),
            ("env_pass", "ALPHA_PROVIDER_CRED"),
            ("env_pass", "MCP_REMOTE_BEARER"),
            ("env_pass", "HOOK_SIGNING_WORD"),
            ("env_pass", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"),
            ("env_pass", "DATABASE_URL"),
            ("env_set", "ZETA_PROVIDER_CRED"),
        ] {
            let value = if key == "env_pass" {
                format!("[{name:?}]")
            } else {
                format!("{{ {name} = \"x\" }}")
            };
            let text = format!("{SECRETS_NAMED}[sandbox]\n{key} = {value}\n");
            let config = Config::from_toml(&text).unwrap();
            let err = config.validate().unwrap_err().to_string();
            assert!(
                err.contains(&format!("sandbox.{key}: {name:?} holds a secret")),
                "{err}"
            );
        }
        let text = format!(
            "{SECRETS_NAMED}[sandbox]\nenv_pass = [\"FOO_VISIBLE\"]\nenv_set = {{ SET_BY_CONFIG = \"yes\" }}\n"
        );
        Config::from_toml(&text).unwrap().validate().unwrap();
    }
}
