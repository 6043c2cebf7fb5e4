//! A load generator that measures agentd from outside, as a client sees it, beside a bare axum
//! WebSocket echo server (the "floor") measured the same way in the same run.
//!
//! `cargo run --release --example load -- <rtt|conc|opens|idle|turns|cache|adapters|telemetry|hooks|busy|mcp|mcp-serve|cluster|soak|all> [options]`
//!
//! Both servers run as child processes so that their CPU time and resident memory can be read
//! from /proc without counting the client's own. Modules: `child` (the servers as processes),
//! `floor` (the echo server), `client` (the JSON-RPC WebSocket client), `report` (percentiles
//! and tables), `mock_model` (the zero-latency model of three APIs), and one module per
//! scenario family: `invoke` (rtt, conc), `opens`, `idle`, `turns`, `cache`, `adapters`,
//! `telemetry`, `hooks`, `busy`, `mcp`, `mcp_serve`, `cluster`, `soak`.

// Reads what the test or benchmark made itself; the bounded readers are for the server.
#![allow(clippy::disallowed_methods)]

mod adapters;
mod busy;
mod cache;
mod child;
mod client;
mod cluster;
mod floor;
mod hooks;
mod idle;
mod invoke;
mod mcp;
mod mcp_serve;
mod mock_model;
mod opens;
mod report;
mod soak;
mod telemetry;
mod turns;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use tokio::signal::unix::{SignalKind, signal};

/// The argument that makes this binary run the floor server instead of a scenario.
pub const FLOOR_ARG: &str = "__floor";

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// One connection, sequential `tool/invoke` of `read_file`.
    Rtt,
    /// Many connections, each with its own session, doing sequential invokes.
    Conc,
    /// `session/open` of a new session.
    Opens,
    /// Many connected sessions held idle: memory per session, and after they close.
    Idle,
    /// Turns against an in-process zero-latency model, text only and with tool calls.
    Turns,
    /// One long session against the mock Anthropic API: the prompt-cache read share per turn.
    Cache,
    /// Turn overhead of each model API adapter: chat completions, Responses, Anthropic.
    Adapters,
    /// Tool-call turns with the OTLP exporter off, then on: its cost per tool call.
    Telemetry,
    /// `tool/invoke` of read_file without hooks, then with a `PreToolUse` command hook: its
    /// cost per call.
    Hooks,
    /// One session's `tool/invoke` idle, then while another session's background shell runs
    /// two busy loops under `[sandbox] cpu_max_percent = 100`. Not part of `all`.
    Busy,
    /// A tool of an MCP server called directly, then through agentd.
    Mcp,
    /// agentd's own `/mcp`: `tools/call` beside `tool/invoke` over the WebSocket.
    McpServe,
    /// Three nodes over one PostgreSQL (needs --database): forwarding, cross-node events,
    /// throughput beside one node, a killed owner. Not part of `all`.
    Cluster,
    /// A long run (1,000,000 calls by default) with the WAL's size and the throughput after
    /// every 50,000. Not part of `all`.
    Soak,
    /// Every scenario in turn.
    All,
}

/// The command line.
#[derive(Debug, Parser)]
#[command(about = "Measures agentd beside a bare WebSocket echo server")]
struct Cli {
    /// The scenario to run.
    #[arg(value_enum)]
    scenario: Scenario,
    /// Measured requests (turns for `turns`, `cache`, `adapters` and `telemetry`); `conc` runs
    /// for --secs unless this is given.
    #[arg(long)]
    requests: Option<u64>,
    /// Connections of `conc`.
    #[arg(long)]
    connections: Option<usize>,
    /// How long `conc` runs when --requests is not given.
    #[arg(long)]
    secs: Option<f64>,
    /// A PostgreSQL URL for agentd's store (default: SQLite in a temporary directory).
    #[arg(long)]
    database: Option<String>,
    /// Sessions `idle` holds.
    #[arg(long)]
    sessions: Option<usize>,
    /// How long `idle` waits after closing its sessions before reading memory again.
    #[arg(long)]
    settle_secs: Option<f64>,
    /// Tool calls per model answer in `turns` and `telemetry`.
    #[arg(long)]
    tool_calls: Option<usize>,
    /// agentd's `server.idle_unload_secs` (default: agentd's own, 1800): how long a session's
    /// actor stays loaded once its connection is gone, which `idle` sees after the close.
    #[arg(long)]
    idle_unload_secs: Option<u64>,
    /// Where agentd's data directory and workspace are made (default: the system's temporary
    /// directory). A tmpfs such as /dev/shm keeps the figures of file-writing scenarios
    /// (`turns`) from drifting with the state of a disk's file system between runs.
    #[arg(long)]
    scratch: Option<PathBuf>,
    /// Tiny counts, so that every scenario finishes in seconds (a check, not a measurement).
    #[arg(long)]
    smoke: bool,
    /// The agentd binary (default: `agentd` in the target directory this example runs from).
    #[arg(long)]
    agentd: Option<PathBuf>,
    /// server-everything's entry script for `mcp` (default: where ./scripts/test installs it,
    /// `target/mcp-servers/…/dist/index.js`).
    #[arg(long)]
    mcp_server: Option<PathBuf>,
}

/// The options every scenario reads, with the defaults (or the smoke defaults) filled in.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `--requests` as given; each scenario has its own default.
    requests: Option<u64>,
    /// Connections of `conc`.
    pub connections: usize,
    /// Duration of `conc` when it does not count requests.
    pub secs: Duration,
    /// Whether `conc` counts requests (given, or smoke without --secs) rather than seconds.
    conc_counts: bool,
    /// Sessions of `idle`.
    pub sessions: usize,
    /// Wait of `idle` after closing.
    pub settle: Duration,
    /// Tool calls per model answer in `turns` and `telemetry`.
    pub tool_calls: usize,
    /// Whether the counts are the smoke ones.
    pub smoke: bool,
    /// The agentd binary.
    pub agentd: PathBuf,
    /// agentd's database URL, when not SQLite.
    pub database: Option<String>,
    /// agentd's `server.idle_unload_secs`, when not its default.
    pub idle_unload_secs: Option<u64>,
    /// Where agentd's data directory and workspace are made, when not the temporary directory.
    pub scratch: Option<PathBuf>,
    /// server-everything's entry script, for `mcp`.
    pub mcp_server: PathBuf,
}

impl Settings {
    /// Measured requests of a scenario whose own default is `default`.
    pub fn requests_or(&self, default: u64) -> u64 {
        self.requests
            .unwrap_or(if self.smoke { 20 } else { default })
            .max(1)
    }

    /// Like [`Settings::requests_or`], with a smoke default of the scenario's own.
    pub fn requests_or_smoke(&self, default: u64, smoke: u64) -> u64 {
        self.requests
            .unwrap_or(if self.smoke { smoke } else { default })
            .max(1)
    }

    /// Whether `conc` counts requests rather than seconds.
    pub fn counts_requests(&self) -> bool {
        self.conc_counts
    }

    /// Unmeasured requests sent first, so that lazily built state and allocator arenas exist
    /// before the baseline is read.
    pub fn warmup(&self, measured: u64) -> u64 {
        (measured / 10).clamp(1, 500)
    }

    /// The store named in the report.
    pub fn backend(&self) -> &'static str {
        if self.database.is_some() {
            "PostgreSQL"
        } else {
            "SQLite"
        }
    }
}

/// `agentd` beside this example's binary: examples live in `target/<profile>/examples/`.
fn default_agentd() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find this program's path")?;
    let profile_dir = exe
        .parent()
        .and_then(|examples| examples.parent())
        .context("this program does not sit in a target directory")?;
    Ok(profile_dir.join("agentd"))
}

/// Where ./scripts/test installs server-everything: `target/mcp-servers/`, beside the profile
/// directory `agentd` sits in.
fn default_mcp_server(agentd: &std::path::Path) -> PathBuf {
    let target = agentd
        .parent()
        .and_then(std::path::Path::parent)
        .unwrap_or_else(|| std::path::Path::new("target"));
    target.join("mcp-servers/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
}

/// The command that reproduces this run, for the top of the report.
fn command_line() -> String {
    let profile = if cfg!(debug_assertions) {
        ""
    } else {
        " --release"
    };
    let args: Vec<String> = std::env::args()
        .skip(1)
        .map(|arg| {
            if arg.is_empty() || arg.contains(char::is_whitespace) {
                format!("'{arg}'")
            } else {
                arg
            }
        })
        .collect();
    format!("cargo run{profile} --example load -- {}", args.join(" "))
}

fn main() -> anyhow::Result<()> {
    if std::env::args().nth(1).as_deref() == Some(FLOOR_ARG) {
        return floor::main();
    }
    let cli = Cli::parse();
    let smoke = cli.smoke;
    let agentd = match cli.agentd {
        Some(path) => path,
        None => default_agentd()?,
    };
    if !agentd.is_file() {
        let build = if cfg!(debug_assertions) {
            "cargo build --bin agentd"
        } else {
            "cargo build --release --bin agentd"
        };
        anyhow::bail!(
            "no agentd binary at {}: build it first with `{build}`, or pass --agentd PATH",
            agentd.display()
        );
    }
    let agentd_path = agentd.clone();
    let settings = Settings {
        requests: cli.requests,
        connections: cli.connections.unwrap_or(if smoke { 2 } else { 50 }).max(1),
        secs: Duration::from_secs_f64(cli.secs.unwrap_or(10.0).max(0.1)),
        conc_counts: cli.requests.is_some() || (smoke && cli.secs.is_none()),
        sessions: cli
            .sessions
            .unwrap_or(if smoke { 20 } else { 10_000 })
            .max(1),
        settle: Duration::from_secs_f64(
            cli.settle_secs
                .unwrap_or(if smoke { 1.0 } else { 30.0 })
                .max(0.0),
        ),
        tool_calls: cli.tool_calls.unwrap_or(3).max(1),
        smoke,
        agentd,
        database: cli.database,
        idle_unload_secs: cli.idle_unload_secs,
        scratch: cli.scratch,
        mcp_server: cli
            .mcp_server
            .unwrap_or_else(|| default_mcp_server(&agentd_path)),
    };
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    runtime.block_on(async {
        let mut terminate = signal(SignalKind::terminate())?;
        // Returning drops the servers, which kills them: none outlives an interrupted run.
        tokio::select! {
            outcome = run(cli.scenario, &settings) => outcome,
            _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted"),
            _ = terminate.recv() => anyhow::bail!("terminated"),
        }
    })
}

/// Prints the heading, then runs the scenarios one after the other.
async fn run(scenario: Scenario, settings: &Settings) -> anyhow::Result<()> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    println!("`{}`", command_line());
    println!();
    println!(
        "{build} build, {cpus} CPUs, agentd store {}, agentd {}",
        settings.backend(),
        settings.agentd.display()
    );
    let all = [
        Scenario::Rtt,
        Scenario::Conc,
        Scenario::Opens,
        Scenario::Idle,
        Scenario::Turns,
        Scenario::Cache,
        Scenario::Adapters,
        Scenario::Telemetry,
        Scenario::Hooks,
        Scenario::Mcp,
        Scenario::McpServe,
    ];
    let chosen: &[Scenario] = if scenario == Scenario::All {
        &all
    } else {
        std::slice::from_ref(&scenario)
    };
    for scenario in chosen {
        println!();
        match scenario {
            Scenario::Rtt => invoke::rtt(settings).await,
            Scenario::Conc => invoke::conc(settings).await,
            Scenario::Opens => opens::run(settings).await,
            Scenario::Idle => idle::run(settings).await,
            Scenario::Turns => turns::run(settings).await,
            Scenario::Cache => cache::run(settings).await,
            Scenario::Adapters => adapters::run(settings).await,
            Scenario::Telemetry => telemetry::run(settings).await,
            Scenario::Hooks => hooks::run(settings).await,
            Scenario::Busy => busy::run(settings).await,
            Scenario::Mcp => mcp::run(settings).await,
            Scenario::McpServe => mcp_serve::run(settings).await,
            Scenario::Cluster => cluster::run(settings).await,
            Scenario::Soak => soak::run(settings).await,
            Scenario::All => unreachable!("`all` is expanded above"),
        }
        .with_context(|| format!("scenario {scenario:?}"))?;
    }
    Ok(())
}
