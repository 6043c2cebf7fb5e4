//! `opens`: sequential `session/open` of a new session on one connection, floor first.

use crate::Settings;
use crate::child::ServerProcess;
use crate::client::RpcClient;
use crate::report::{Measured, print_latency_table};

/// Opens unless --requests says otherwise.
const OPENS: u64 = 2_000;

/// Measures session/open on the floor, then on agentd.
pub async fn run(settings: &Settings) -> anyhow::Result<()> {
    let requests = settings.requests_or(OPENS);
    let warmup = settings.warmup(requests);
    println!("### opens: session/open of a new session, 1 connection, sequential");
    println!();
    println!(
        "{requests} measured opens after {warmup} unmeasured; agentd on {}. Every session stays \
         loaded and watched by the connection.",
        settings.backend()
    );
    println!();
    let floor = ServerProcess::floor().await?;
    let floor_run = opens(&floor, requests, warmup).await?;
    floor.stop().await?;
    let agentd = ServerProcess::agentd(settings, None).await?;
    let agentd_run = opens(&agentd, requests, warmup).await?;
    agentd.stop().await?;
    print_latency_table(&floor_run, &agentd_run);
    Ok(())
}

async fn opens(server: &ServerProcess, requests: u64, warmup: u64) -> anyhow::Result<Measured> {
    let mut client = RpcClient::connect(server.addr()).await?;
    for _ in 0..warmup {
        client.open().await?;
    }
    let measured =
        Measured::sequential(server, requests, async || client.open().await.map(drop)).await?;
    client.close().await?;
    Ok(measured)
}
