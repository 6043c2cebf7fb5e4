//! `hooks`: what a `PreToolUse` command hook adds to a tool call. Sequential `tool/invoke` of
//! `read_file`, as `rtt` sends them, on an agentd without hooks, then on a fresh one with one
//! hook that reads its JSON on stdin and allows (`cat >/dev/null`, exit 0). Both run with the
//! sandbox at its defaults, as every scenario does, so the hook's process is started in the
//! session's sandbox: the difference is the hook's whole path (event JSON, sandboxed `sh -c`,
//! its exit read, `hook/ran` sent).

use crate::Settings;
use crate::child::ServerProcess;
use crate::client::RpcClient;
use crate::report::{LATENCY_HEADER, Measured, Table, count, latency_row, ratio, us};

/// Calls of each run unless --requests says otherwise.
const CALLS: u64 = 2_000;
/// The hook: reads the event's JSON, then exits 0, which lets the call go on.
const HOOK: &str = "[[hooks]]\nevent = \"PreToolUse\"\ncommand = \"cat >/dev/null\"\n\
                    matcher = \"read_file\"\ntimeout_secs = 30\n";

/// Measures `read_file` invokes without hooks, then with the `PreToolUse` hook.
pub async fn run(settings: &Settings) -> anyhow::Result<()> {
    let calls = settings.requests_or(CALLS);
    let warmup = settings.warmup(calls);
    println!("### hooks: tool/invoke of read_file without hooks, then with a PreToolUse hook");
    println!();
    println!(
        "{calls} measured sequential calls after {warmup} unmeasured on one connection, on an \
         agentd without `[[hooks]]`, then on a fresh one with `event = \"PreToolUse\"`, \
         `command = \"cat >/dev/null\"`, `matcher = \"read_file\"`; sandbox at its defaults; \
         agentd on {}.",
        settings.backend()
    );
    println!();
    let without = measure(settings, "", calls, warmup).await?;
    let with = measure(settings, HOOK, calls, warmup).await?;

    let mut table = Table::new(&LATENCY_HEADER);
    table.row(latency_row("no hooks", &without));
    table.row(latency_row("PreToolUse hook", &with));
    let q = |run: &Measured, q: f64| run.latencies.quantile(q).as_secs_f64();
    let mut difference = vec!["hook − none".to_string(), String::new()];
    let mut quotient = vec!["hook ÷ none".to_string(), String::new()];
    for quantile in [0.5, 0.9, 0.99, 0.999] {
        difference.push(format!(
            "{:+.1}",
            (q(&with, quantile) - q(&without, quantile)) * 1e6
        ));
        quotient.push(ratio(q(&with, quantile), q(&without, quantile)));
    }
    let cpu = |run: &Measured| run.cpu_per_request().as_secs_f64();
    difference.push(String::new());
    difference.push(format!("{:+.1}", (cpu(&with) - cpu(&without)) * 1e6));
    quotient.push(ratio(with.throughput(), without.throughput()));
    quotient.push(ratio(cpu(&with), cpu(&without)));
    table.row(difference);
    table.row(quotient);
    table.print();
    println!();
    println!(
        "Added per call by the hook: {} µs at p50, {} µs at p90 ({} calls each; agentd's CPU \
         counts its own threads, not the hook's processes).",
        us(with.latencies.p50().saturating_sub(without.latencies.p50())),
        us(with
            .latencies
            .quantile(0.9)
            .saturating_sub(without.latencies.quantile(0.9))),
        count(calls),
    );
    Ok(())
}

/// Starts agentd with `config`, measures sequential `read_file` invokes, stops it.
async fn measure(
    settings: &Settings,
    config: &str,
    calls: u64,
    warmup: u64,
) -> anyhow::Result<Measured> {
    let agentd = ServerProcess::agentd_configured(settings, None, config).await?;
    let mut client = RpcClient::connect(agentd.addr()).await?;
    client.open().await?;
    for _ in 0..warmup {
        client.invoke().await?;
    }
    let measured = Measured::sequential(&agentd, calls, async || client.invoke().await).await?;
    client.close().await?;
    agentd.stop().await?;
    Ok(measured)
}
