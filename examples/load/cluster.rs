//! `cluster`: three agentd nodes over one PostgreSQL (`--database`, which must be PostgreSQL):
//! `tool/invoke` through the owner beside the same call forwarded by another node (and the
//! floor), the latency of an event from its commit on the owner to a watcher on another node,
//! the time a client waits after the owner is killed, and the throughput of three nodes beside
//! one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::sync::Barrier;

use crate::Settings;
use crate::child::ServerProcess;
use crate::client::RpcClient;
use crate::report::{Latencies, Table, count, nanos, ratio, us};

/// Requests of each latency run unless --requests says otherwise.
const REQUESTS: u64 = 2_000;
/// The lease of the nodes (and so the wait after a kill).
const LEASE_SECS: u64 = 10;

/// The three nodes, in order.
struct Nodes(Vec<ServerProcess>);

/// Starts `n` cluster nodes on free ports of loopback.
async fn nodes(settings: &Settings, n: usize) -> anyhow::Result<Nodes> {
    let ports: Vec<u16> = (0..n)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|listener| listener.local_addr())
                .map(|addr| addr.port())
        })
        .collect::<Result<_, _>>()?;
    let mut nodes = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let config = format!(
            "[cluster]\nenabled = true\nnode_id = \"node-{i}\"\n\
             advertise_url = \"http://127.0.0.1:{port}\"\nlease_secs = {LEASE_SECS}\n\
             secret = \"load-cluster-secret-0123456789\"\n"
        );
        let bind = format!("127.0.0.1:{port}");
        nodes.push(ServerProcess::agentd_bound(settings, None, &config, &bind).await?);
    }
    Ok(Nodes(nodes))
}

/// `count` sequential invokes on `client`, one latency each.
async fn invokes(client: &mut RpcClient, count: u64) -> anyhow::Result<Latencies> {
    let mut samples = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let sent = Instant::now();
        client.invoke().await?;
        samples.push(nanos(sent.elapsed()));
    }
    Ok(Latencies::new(samples))
}

fn row(label: &str, run: &Latencies, base: &Latencies) -> Vec<String> {
    vec![
        label.to_string(),
        count(run.len() as u64),
        us(run.p50()),
        us(run.quantile(0.9)),
        us(run.quantile(0.99)),
        ratio(run.p50().as_secs_f64(), base.p50().as_secs_f64()),
    ]
}

/// Runs every part in turn.
pub async fn run(settings: &Settings) -> anyhow::Result<()> {
    if !settings
        .database
        .as_deref()
        .is_some_and(|url| url.starts_with("postgres"))
    {
        bail!("cluster needs --database postgres://… (one database every node shares)");
    }
    let requests = settings.requests_or(REQUESTS);
    let warmup = settings.warmup(requests);
    println!("### cluster: three nodes over one PostgreSQL, lease {LEASE_SECS} s");
    println!();

    // The floor, measured the same way.
    let floor = ServerProcess::floor().await?;
    let mut client = RpcClient::connect(floor.addr()).await?;
    client.open().await?;
    invokes(&mut client, warmup).await?;
    let floor_run = invokes(&mut client, requests).await?;
    client.close().await?;
    floor.stop().await?;

    let nodes = nodes(settings, 3).await?;
    let (a, b, c) = (&nodes.0[0], &nodes.0[1], &nodes.0[2]);
    // A opens the session, so A owns it.
    let mut on_a = RpcClient::connect(a.addr()).await?;
    let session = on_a.open().await?;
    invokes(&mut on_a, warmup).await?;
    let local = invokes(&mut on_a, requests).await?;
    let mut on_b = RpcClient::connect(b.addr()).await?;
    on_b.join(&session).await?;
    invokes(&mut on_b, warmup).await?;
    let forwarded = invokes(&mut on_b, requests).await?;
    on_b.close().await?;

    println!(
        "`tool/invoke` of read_file (12 bytes), sequential, {requests} requests after {warmup}:"
    );
    println!();
    let mut table = Table::new(&["path", "requests", "p50", "p90", "p99", "p50 / floor"]);
    table.row(row("floor (axum echo)", &floor_run, &floor_run));
    table.row(row("through the owner", &local, &floor_run));
    table.row(row("forwarded by another node", &forwarded, &floor_run));
    table.print();
    println!();

    // Cross-node events: C watches while A's client invokes; each tool/completed is timed on
    // arrival at C against its commit time in the table.
    let mut on_c = RpcClient::connect(c.addr()).await?;
    on_c.join(&session).await?;
    let watched = requests.min(1_000);
    let watcher = tokio::spawn(async move {
        let mut arrivals = Vec::with_capacity(watched as usize);
        while (arrivals.len() as u64) < watched {
            let text = on_c.next_text().await?;
            if !text.as_str().contains(r#""method":"tool/completed""#) {
                continue;
            }
            let event: Value = serde_json::from_str(text.as_str())?;
            let seq = event["params"]["seq"].as_i64().context("seq")?;
            arrivals.push((seq, OffsetDateTime::now_utc()));
        }
        anyhow::Ok((arrivals, on_c))
    });
    invokes(&mut on_a, watched).await?;
    let (arrivals, on_c) = watcher.await??;
    on_c.close().await?;
    let first = arrivals.first().map_or(0, |(seq, _)| seq - 1);
    let url = format!(
        "http://{}/api/sessions/{session}/events?after_seq={first}&limit=10000",
        a.addr()
    );
    let stored: Value = reqwest::get(&url).await?.json().await?;
    let committed: std::collections::HashMap<i64, OffsetDateTime> = stored["events"]
        .as_array()
        .context("events")?
        .iter()
        .filter_map(|event| {
            let at = OffsetDateTime::parse(event["created_at"].as_str()?, &Rfc3339).ok()?;
            Some((event["seq"].as_i64()?, at))
        })
        .collect();
    let lags: Vec<u64> = arrivals
        .iter()
        .filter_map(|(seq, arrived)| {
            let lag = *arrived - *committed.get(seq)?;
            Some(nanos(Duration::try_from(lag).unwrap_or_default()))
        })
        .collect();
    let lags = Latencies::new(lags);
    println!(
        "An event stored on the owner (A) to its frame on a watcher of another node (C), \
         {} tool/completed events:",
        lags.len()
    );
    println!();
    let mut table = Table::new(&["events", "p50", "p90", "p99"]);
    table.row(vec![
        count(lags.len() as u64),
        us(lags.p50()),
        us(lags.quantile(0.9)),
        us(lags.quantile(0.99)),
    ]);
    table.print();
    println!();

    // Throughput: 3 nodes beside 1, each connection with a session of its own node.
    let connections = settings.connections.max(3);
    let one = throughput(&nodes.0[..1], connections, settings.secs).await?;
    let three = throughput(&nodes.0, connections, settings.secs).await?;
    println!(
        "Throughput, {connections} connections doing sequential invokes for {:.0} s, sessions owned by the node they connect to:",
        settings.secs.as_secs_f64()
    );
    println!();
    let mut table = Table::new(&["nodes", "requests/s", "3 nodes / 1"]);
    table.row(vec!["1".into(), format!("{one:.0}"), String::new()]);
    table.row(vec!["3".into(), format!("{three:.0}"), ratio(three, one)]);
    table.print();
    println!();

    // The owner dies: a client of another node waits for the lease to lapse, then goes on.
    let mut nodes = nodes.0;
    let owner = nodes.remove(0);
    let mut on_b = RpcClient::connect(nodes[0].addr()).await?;
    on_b.join(&session).await?;
    on_b.invoke().await?;
    on_a.close().await.ok();
    owner.kill().await?;
    let killed = Instant::now();
    on_b.invoke().await?;
    let waited = killed.elapsed();
    println!(
        "After kill -9 of the owner, a tool/invoke through another node answered in {:.2} s \
         (lease {LEASE_SECS} s: the survivor takes the session over once the lease lapses).",
        waited.as_secs_f64()
    );
    on_b.close().await?;
    for node in nodes {
        node.stop().await?;
    }
    Ok(())
}

/// Requests per second of `connections` connections spread over `nodes` for `secs`.
async fn throughput(
    nodes: &[ServerProcess],
    connections: usize,
    secs: Duration,
) -> anyhow::Result<f64> {
    let barrier = Arc::new(Barrier::new(connections));
    let mut runs = Vec::new();
    for i in 0..connections {
        let addr = nodes[i % nodes.len()].addr();
        let barrier = Arc::clone(&barrier);
        runs.push(tokio::spawn(async move {
            let mut client = RpcClient::connect(addr).await?;
            client.open().await?;
            for _ in 0..20 {
                client.invoke().await?;
            }
            barrier.wait().await;
            let started = Instant::now();
            let mut done = 0u64;
            while started.elapsed() < secs {
                client.invoke().await?;
                done += 1;
            }
            client.close().await?;
            anyhow::Ok((done, started.elapsed()))
        }));
    }
    let mut total = 0.0;
    for run in runs {
        let (done, elapsed) = run.await??;
        total += done as f64 / elapsed.as_secs_f64();
    }
    Ok(total)
}
