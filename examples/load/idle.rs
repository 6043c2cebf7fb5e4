//! `idle`: N connections, each with a session opened and one call made, held open; the server's
//! memory per session, then its memory some seconds after they all closed. Floor first.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures_util::{StreamExt, TryStreamExt, stream};
use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

use crate::Settings;
use crate::child::{ServerProcess, Usage};
use crate::client::RpcClient;
use crate::report::{Latencies, Measured, Table, count, mib, nanos, print_latency_table, ratio};

/// Sessions set up at once: enough to keep both CPUs busy, few enough not to fill the accept
/// queue.
const SETUP_CONCURRENCY: usize = 32;
/// Closes in flight at once.
const CLOSE_CONCURRENCY: usize = 256;
/// Sessions opened and closed before the baseline, so that lazily built state is in it.
const WARMUP_SESSIONS: usize = 50;
/// Descriptors the client keeps for itself beside one per connection.
const FD_RESERVE: u64 = 64;
/// A pause before reading memory, so that work the last requests caused has finished.
const QUIET: Duration = Duration::from_millis(500);
/// Past the unload delay, the time the unloads and the trim after them take.
const UNLOAD_MARGIN: Duration = Duration::from_secs(3);

/// Raises this process's soft open-file limit to the hard one; returns the limit in force.
fn raise_fd_limit() -> u64 {
    let limit = getrlimit(Resource::Nofile);
    if limit.current.is_some() && limit.current != limit.maximum {
        // Without the raise, `idle` stops at the soft limit and says so.
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: limit.maximum,
                maximum: limit.maximum,
            },
        );
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// One server's run: the set-up of the sessions, then memory held and after the close.
struct IdleRun {
    setup: Measured,
    held: Usage,
    closed_rss: u64,
    /// Anonymous memory (heap and stacks) at the start and after the close.
    start_anon: u64,
    closed_anon: u64,
}

/// Measures the floor, then agentd.
pub async fn run(settings: &Settings) -> anyhow::Result<()> {
    let sessions = settings.sessions;
    let limit = raise_fd_limit();
    if sessions as u64 + FD_RESERVE > limit {
        bail!(
            "{sessions} sessions need {} open files; the limit is {limit} (raise the hard limit, \
             e.g. `ulimit -Hn`, or pass fewer --sessions)",
            sessions as u64 + FD_RESERVE
        );
    }
    let warmup = WARMUP_SESSIONS.min(sessions);
    let settle = settings.settle;
    // With a short unload, the warm-up sessions' actors unload before the start is read, so
    // the start is a server that has been through a whole session's life (its code paged in
    // for unloading too), as the server after the close is.
    let warm_wait = settings
        .idle_unload_secs
        .map(Duration::from_secs)
        .filter(|unload| *unload <= settle)
        .map(|unload| unload + UNLOAD_MARGIN);
    println!(
        "### idle: {} connected sessions (session/open, one tool/invoke, then held)",
        count(sessions as u64)
    );
    println!();
    println!(
        "{warmup} sessions opened and closed first; set-up {SETUP_CONCURRENCY} at a time; memory \
         read again {:.0} s after every connection closed; agentd on {}; client open-file limit \
         {limit}.",
        settle.as_secs_f64(),
        settings.backend()
    );
    if let Some(wait) = warm_wait {
        println!();
        println!(
            "The start is read {:.0} s after the warm-up closed, once its actors have unloaded.",
            wait.as_secs_f64()
        );
    }
    println!();
    let floor = ServerProcess::floor().await?;
    let floor_run = hold(&floor, sessions, warmup, warm_wait, settle).await?;
    floor.stop().await?;
    let agentd = ServerProcess::agentd(settings, None).await?;
    let agentd_run = hold(&agentd, sessions, warmup, warm_wait, settle).await?;
    agentd.stop().await?;

    println!("Set-up, one request = connect + session/open + tool/invoke:");
    println!();
    print_latency_table(&floor_run.setup, &agentd_run.setup);
    println!();
    let per_session =
        |run: &IdleRun| run.held.rss.saturating_sub(run.setup.before.rss) as f64 / sessions as f64;
    let closed_share = |run: &IdleRun| run.closed_rss as f64 / run.setup.before.rss.max(1) as f64;
    let mut table = Table::new(&[
        "server",
        "sessions",
        "RSS start MiB",
        "RSS held MiB",
        "KiB per session",
        &format!("RSS {:.0} s after close MiB", settle.as_secs_f64()),
        "after close ÷ start",
        "anon start MiB",
        "anon after close MiB",
    ]);
    for (label, run) in [("floor", &floor_run), ("agentd", &agentd_run)] {
        table.row(vec![
            label.to_string(),
            count(sessions as u64),
            mib(run.setup.before.rss),
            mib(run.held.rss),
            format!("{:.1}", per_session(run) / 1024.0),
            mib(run.closed_rss),
            format!("{:.2}", closed_share(run)),
            mib(run.start_anon),
            mib(run.closed_anon),
        ]);
    }
    table.row(vec![
        "agentd ÷ floor".to_string(),
        String::new(),
        ratio(
            agentd_run.setup.before.rss as f64,
            floor_run.setup.before.rss as f64,
        ),
        ratio(agentd_run.held.rss as f64, floor_run.held.rss as f64),
        ratio(per_session(&agentd_run), per_session(&floor_run)),
        ratio(agentd_run.closed_rss as f64, floor_run.closed_rss as f64),
        String::new(),
        String::new(),
        String::new(),
    ]);
    table.print();
    Ok(())
}

/// A connection with a session and one call made.
async fn connect_session(server: &ServerProcess) -> anyhow::Result<RpcClient> {
    let mut client = RpcClient::connect(server.addr()).await?;
    client.open().await?;
    client.invoke().await?;
    Ok(client)
}

async fn hold(
    server: &ServerProcess,
    sessions: usize,
    warmup: usize,
    warm_wait: Option<Duration>,
    settle: Duration,
) -> anyhow::Result<IdleRun> {
    for _ in 0..warmup {
        connect_session(server).await?.close().await?;
    }
    tokio::time::sleep(warm_wait.unwrap_or(QUIET)).await;
    let before = server.usage()?;
    let start_anon = server.anon()?;
    let started = Instant::now();
    let held: Vec<(RpcClient, u64)> = stream::iter(0..sessions)
        .map(|_| async {
            let sent = Instant::now();
            let client = connect_session(server).await?;
            anyhow::Ok((client, nanos(sent.elapsed())))
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .try_collect()
        .await
        .with_context(|| format!("setting up {sessions} sessions on {}", server.label))?;
    let elapsed = started.elapsed();
    let after = server.usage()?;
    let (clients, samples): (Vec<RpcClient>, Vec<u64>) = held.into_iter().unzip();
    tokio::time::sleep(QUIET).await;
    let held = server.usage()?;
    stream::iter(clients)
        .map(RpcClient::close)
        .buffer_unordered(CLOSE_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await
        .with_context(|| format!("closing {sessions} sessions on {}", server.label))?;
    tokio::time::sleep(settle).await;
    let closed_rss = server.rss()?;
    let closed_anon = server.anon()?;
    Ok(IdleRun {
        setup: Measured {
            latencies: Latencies::new(samples),
            elapsed,
            before,
            after,
        },
        held,
        closed_rss,
        start_anon,
        closed_anon,
    })
}
