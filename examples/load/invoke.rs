//! `rtt` and `conc`: sequential `tool/invoke` of `read_file` on one connection, and on many at
//! once, each with its own session. The floor runs first with the same client code.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::Barrier;

use crate::Settings;
use crate::child::ServerProcess;
use crate::client::RpcClient;
use crate::report::{Latencies, Measured, nanos, print_latency_table};

/// Requests of `rtt` unless --requests says otherwise.
const RTT_REQUESTS: u64 = 10_000;
/// Unmeasured invokes each `conc` connection sends before the clock starts.
const CONC_WARMUP: u64 = 20;

/// `rtt`: one connection, N sequential invokes, each waiting for its result.
pub async fn rtt(settings: &Settings) -> anyhow::Result<()> {
    let requests = settings.requests_or(RTT_REQUESTS);
    let warmup = settings.warmup(requests);
    println!("### rtt: 1 connection, sequential tool/invoke of read_file (12 bytes)");
    println!();
    println!(
        "{} measured requests after {} unmeasured; agentd on {}.",
        requests,
        warmup,
        settings.backend()
    );
    println!();
    let floor = ServerProcess::floor().await?;
    let floor_run = sequential(&floor, requests, warmup).await?;
    floor.stop().await?;
    let agentd = ServerProcess::agentd(settings, None).await?;
    let agentd_run = sequential(&agentd, requests, warmup).await?;
    agentd.stop().await?;
    print_latency_table(&floor_run, &agentd_run);
    Ok(())
}

async fn sequential(
    server: &ServerProcess,
    requests: u64,
    warmup: u64,
) -> anyhow::Result<Measured> {
    let mut client = RpcClient::connect(server.addr()).await?;
    client.open().await?;
    for _ in 0..warmup {
        client.invoke().await?;
    }
    let measured = Measured::sequential(server, requests, async || client.invoke().await).await?;
    client.close().await?;
    Ok(measured)
}

/// How long each `conc` connection goes on.
#[derive(Debug, Clone, Copy)]
enum Plan {
    /// This many requests in all, shared out between the connections.
    Requests(u64),
    /// Until this much time has passed.
    For(Duration),
}

/// `conc`: C connections with a session each, sequential invokes, all at once.
pub async fn conc(settings: &Settings) -> anyhow::Result<()> {
    let connections = settings.connections;
    let plan = if settings.counts_requests() {
        Plan::Requests(settings.requests_or(0).max(connections as u64))
    } else {
        Plan::For(settings.secs)
    };
    println!(
        "### conc: {connections} connections, each with its own session, sequential tool/invoke of read_file"
    );
    println!();
    let length = match plan {
        Plan::Requests(total) => format!("{total} measured requests in all"),
        Plan::For(duration) => format!("{:.0} s each", duration.as_secs_f64()),
    };
    println!(
        "{length}, after {CONC_WARMUP} unmeasured per connection; agentd on {}.",
        settings.backend()
    );
    println!();
    let floor = ServerProcess::floor().await?;
    let floor_run = concurrent(&floor, connections, plan).await?;
    floor.stop().await?;
    let agentd = ServerProcess::agentd(settings, None).await?;
    let agentd_run = concurrent(&agentd, connections, plan).await?;
    agentd.stop().await?;
    print_latency_table(&floor_run, &agentd_run);
    Ok(())
}

async fn concurrent(
    server: &ServerProcess,
    connections: usize,
    plan: Plan,
) -> anyhow::Result<Measured> {
    // Everyone is connected and warm at the first barrier, the clock starts at the second and
    // the server's usage is read at the third, before the connections close.
    let ready = Arc::new(Barrier::new(connections + 1));
    let go = Arc::new(Barrier::new(connections + 1));
    let done = Arc::new(Barrier::new(connections + 1));
    let mut tasks = Vec::with_capacity(connections);
    for index in 0..connections {
        let mut client = RpcClient::connect(server.addr()).await?;
        client.open().await?;
        for _ in 0..CONC_WARMUP {
            client.invoke().await?;
        }
        let quota = match plan {
            Plan::Requests(total) => {
                let share = total / connections as u64;
                let extra = u64::from((index as u64) < total % connections as u64);
                Limit::Count(share + extra)
            }
            Plan::For(duration) => Limit::Time(duration),
        };
        let (ready, go, done) = (Arc::clone(&ready), Arc::clone(&go), Arc::clone(&done));
        tasks.push(tokio::spawn(async move {
            ready.wait().await;
            go.wait().await;
            let outcome = invoke_until(&mut client, quota).await;
            let finished = Instant::now();
            // Every task reaches the barrier, failed or not, so that none waits forever.
            done.wait().await;
            let closed = client.close().await;
            outcome.and_then(|samples| closed.map(|()| (samples, finished)))
        }));
    }
    ready.wait().await;
    let before = server.usage()?;
    go.wait().await;
    let started = Instant::now();
    done.wait().await;
    let after = server.usage()?;
    let mut parts = Vec::with_capacity(connections);
    let mut last = started;
    for task in tasks {
        let (samples, finished) = task.await.context("a connection task panicked")??;
        parts.push(samples);
        last = last.max(finished);
    }
    let elapsed = last.duration_since(started);
    Ok(Measured {
        latencies: Latencies::merged(parts),
        elapsed,
        before,
        after,
    })
}

/// When one `conc` connection stops.
#[derive(Debug, Clone, Copy)]
enum Limit {
    /// After this many requests.
    Count(u64),
    /// Once this long has passed since it started.
    Time(Duration),
}

/// Sequential invokes until `limit`; one latency sample each.
async fn invoke_until(client: &mut RpcClient, limit: Limit) -> anyhow::Result<Vec<u64>> {
    let started = Instant::now();
    let mut samples = Vec::new();
    loop {
        let done = match limit {
            Limit::Count(count) => samples.len() as u64 >= count,
            Limit::Time(duration) => started.elapsed() >= duration,
        };
        if done {
            return Ok(samples);
        }
        let sent = Instant::now();
        client.invoke().await?;
        samples.push(nanos(sent.elapsed()));
    }
}
