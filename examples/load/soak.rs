//! `soak`: a long run of `tool/invoke` of `read_file` over 20 connections, reporting after each
//! slice of calls the throughput of that slice and the size of agentd's SQLite WAL, so a WAL
//! that grows without bound, or a throughput that sags as it grows, shows in the table.

use std::time::Instant;

use anyhow::Context;

use crate::Settings;
use crate::child::ServerProcess;
use crate::client::RpcClient;

/// Connections the soak keeps busy.
const CONNECTIONS: usize = 20;
/// Calls between two rows of the report.
const SLICE: u64 = 50_000;

pub async fn run(settings: &Settings) -> anyhow::Result<()> {
    let total = settings.requests_or(1_000_000);
    let connections = if settings.smoke { 2 } else { CONNECTIONS };
    let slice = if settings.smoke {
        total.div_ceil(2)
    } else {
        SLICE
    };
    println!(
        "### soak: {total} tool/invoke of read_file over {connections} connections, a row every {slice}"
    );
    println!();
    let agentd = ServerProcess::agentd(settings, None).await?;
    let wal = agentd.data_dir().map(|dir| dir.join("agentd.db-wal"));
    if settings.database.is_some() {
        println!(
            "agentd on PostgreSQL: there is no WAL file to watch; the throughput still counts."
        );
        println!();
    }
    let mut clients = Vec::with_capacity(connections);
    for _ in 0..connections {
        let mut client = RpcClient::connect(agentd.addr()).await?;
        client.open().await?;
        clients.push(client);
    }
    println!("| calls | req/s in the slice | WAL (MiB) |");
    println!("|---:|---:|---:|");
    let mut done = 0u64;
    while done < total {
        let this_slice = slice.min(total - done);
        let started = Instant::now();
        let mut tasks = Vec::with_capacity(connections);
        for (index, mut client) in clients.drain(..).enumerate() {
            let share = this_slice / connections as u64
                + u64::from((index as u64) < this_slice % connections as u64);
            tasks.push(tokio::spawn(async move {
                for _ in 0..share {
                    client.invoke().await?;
                }
                anyhow::Ok(client)
            }));
        }
        for task in tasks {
            clients.push(task.await.context("a connection task panicked")??);
        }
        let elapsed = started.elapsed().as_secs_f64();
        done += this_slice;
        let wal_mib = wal
            .as_ref()
            .and_then(|path| std::fs::metadata(path).ok())
            .map_or_else(
                || "-".to_string(),
                |m| format!("{:.1}", m.len() as f64 / (1 << 20) as f64),
            );
        println!(
            "| {done} | {:.0} | {wal_mib} |",
            this_slice as f64 / elapsed.max(1e-9)
        );
    }
    for client in clients {
        client.close().await?;
    }
    let _kept = agentd.stop_keeping_dir().await?;
    let after_stop = wal
        .as_ref()
        .and_then(|path| std::fs::metadata(path).ok())
        .map_or(0, |m| m.len());
    println!();
    println!("WAL after the server stopped: {after_stop} bytes.");
    Ok(())
}
