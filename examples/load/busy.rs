//! `busy`: one session's CPU-bound commands beside another session's tool calls. Session B's
//! sequential `tool/invoke` of `read_file` is measured while the machine is idle; then session
//! A starts, as a background `shell` task, two busy loops (more than the one core its
//! `[sandbox] cpu_max_percent = 100` allows), and B is measured again while they spin; then
//! A's task is cancelled. Same agentd throughout: the ratio is what A's loops cost B.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Deserialize;

use crate::Settings;
use crate::child::ServerProcess;
use crate::client::RpcClient;
use crate::report::{LATENCY_HEADER, Measured, Table, latency_row, ratio};

/// Calls of each of B's runs unless --requests says otherwise.
const CALLS: u64 = 2_000;
/// How long the loops spin at most, should the cancel never arrive.
const LOOP_SECS: u64 = 60;
/// How long the loops run before B's busy run starts, so that they are all scheduled.
const SPIN_UP: Duration = Duration::from_secs(1);
/// The per-session CPU cap (the default: one core), written out so that the run says it.
const CONFIG: &str = "[sandbox]\ncpu_max_percent = 100\n";

/// The fields of a `session/open` result this scenario reads.
#[derive(Debug, Deserialize)]
struct Opened {
    sandbox: Sandbox,
}

/// `session/open`'s `sandbox`.
#[derive(Debug, Deserialize)]
struct Sandbox {
    #[serde(default)]
    layers: Vec<String>,
}

/// The fields of a background call's `tool/invoke` result this scenario reads.
#[derive(Debug, Deserialize)]
struct Invoked {
    structured_metadata: TaskMetadata,
}

/// A background call's `structured_metadata`.
#[derive(Debug, Deserialize)]
struct TaskMetadata {
    task_id: String,
}

/// The machine's CPU time, busy and in all, from the `cpu` line of /proc/stat (in ticks).
#[derive(Debug, Clone, Copy)]
struct MachineCpu {
    busy: u64,
    total: u64,
}

impl MachineCpu {
    fn now() -> anyhow::Result<Self> {
        let stat = std::fs::read_to_string("/proc/stat").context("cannot read /proc/stat")?;
        let line = stat.lines().next().context("empty /proc/stat")?;
        let ticks: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .context("malformed /proc/stat")?;
        // user nice system idle iowait irq softirq steal …; idle and iowait are not busy.
        let total: u64 = ticks.iter().take(8).sum();
        let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
        Ok(Self {
            busy: total - idle,
            total,
        })
    }

    /// The busy share of every CPU since `earlier`, in cores.
    fn cores_busy_since(&self, earlier: &Self, cpus: usize) -> f64 {
        let total = self.total.saturating_sub(earlier.total).max(1) as f64;
        (self.busy.saturating_sub(earlier.busy)) as f64 / total * cpus as f64
    }
}

/// Measures B idle, then beside A's busy loops, on one agentd.
pub async fn run(settings: &Settings) -> anyhow::Result<()> {
    let calls = settings.requests_or(CALLS);
    let warmup = settings.warmup(calls);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let secs = if settings.smoke { 5 } else { LOOP_SECS };
    let loops = format!(
        "timeout {secs} sh -c 'while :; do :; done' & timeout {secs} sh -c 'while :; do :; done' & wait"
    );
    println!(
        "### busy: session B's tool/invoke of read_file, idle, then beside session A's two busy loops"
    );
    println!();
    println!(
        "{calls} measured sequential calls of B after {warmup} unmeasured, first with nothing \
         else running, then while A's background `shell` task runs `{loops}`; `{}`; one agentd \
         on {}; {cpus} CPUs.",
        CONFIG.trim().replace('\n', " "),
        settings.backend()
    );
    println!();
    let agentd = ServerProcess::agentd_configured(settings, None, CONFIG).await?;
    let mut a = RpcClient::connect(agentd.addr()).await?;
    let opened: Opened = serde_json::from_str(&a.open_answer().await?)
        .context("session/open result without sandbox.layers")?;
    let capped = opened
        .sandbox
        .layers
        .iter()
        .any(|layer| layer == "cpu_cgroup");
    let mut b = RpcClient::connect(agentd.addr()).await?;
    b.open().await?;
    for _ in 0..warmup {
        b.invoke().await?;
    }

    let before = MachineCpu::now()?;
    let idle = Measured::sequential(&agentd, calls, async || b.invoke().await).await?;
    let idle_cores = MachineCpu::now()?.cores_busy_since(&before, cpus);

    let arguments = serde_json::json!({ "command": loops, "run_in_background": true });
    let answer = a.invoke_answer("shell", &arguments.to_string()).await?;
    let invoked: Invoked =
        serde_json::from_str(&answer).context("a background shell call without a task_id")?;
    let task_id = invoked.structured_metadata.task_id;
    tokio::time::sleep(SPIN_UP).await;
    let before = MachineCpu::now()?;
    let started = Instant::now();
    let busy = Measured::sequential(&agentd, calls, async || b.invoke().await).await?;
    let busy_cores = MachineCpu::now()?.cores_busy_since(&before, cpus);
    let spun = started.elapsed() + SPIN_UP;
    let params = serde_json::json!({ "session_id": a.session(), "task_id": task_id });
    let cancelled = a.call("task/cancel", &params.to_string()).await?;
    if spun >= Duration::from_secs(secs) {
        bail!(
            "B's busy run took {:.1} s, longer than the loops' {secs} s: pass fewer --requests",
            spun.as_secs_f64()
        );
    }
    b.close().await?;
    a.close().await?;
    agentd.stop().await?;

    let mut header = LATENCY_HEADER.to_vec();
    header[0] = "session B";
    header.push("machine busy, cores");
    let mut table = Table::new(&header);
    let mut row = latency_row("idle", &idle);
    row.push(format!("{idle_cores:.2} of {cpus}"));
    table.row(row);
    let mut row = latency_row("beside A's loops", &busy);
    row.push(format!("{busy_cores:.2} of {cpus}"));
    table.row(row);
    let q = |run: &Measured, q: f64| run.latencies.quantile(q).as_secs_f64();
    let mut quotient = vec!["busy ÷ idle".to_string(), String::new()];
    for quantile in [0.5, 0.9, 0.99, 0.999] {
        quotient.push(ratio(q(&busy, quantile), q(&idle, quantile)));
    }
    quotient.push(ratio(busy.throughput(), idle.throughput()));
    quotient.push(ratio(
        busy.cpu_per_request().as_secs_f64(),
        idle.cpu_per_request().as_secs_f64(),
    ));
    table.row(quotient);
    table.print();
    println!();
    if capped {
        println!(
            "The sandbox's `cpu_cgroup` layer is on (session/open's `sandbox.layers`): A's \
             processes share 100% of one core."
        );
    } else {
        println!(
            "The sandbox's `cpu_cgroup` layer is NOT available on this machine (session/open's \
             `sandbox.layers`: {}): A's loops are not capped.",
            opened.sandbox.layers.join(", ")
        );
    }
    println!(
        "B's p50 beside the loops is {} its idle p50 (the aim: within 2×). A's task was \
         cancelled after {:.1} s: {cancelled}.",
        ratio(q(&busy, 0.5), q(&idle, 0.5)),
        spun.as_secs_f64()
    );
    Ok(())
}
