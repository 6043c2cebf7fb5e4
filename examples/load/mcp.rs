//! `mcp`: one tool of an MCP server — the reference server-everything's `echo`, over stdio —
//! called directly with the same SDK agentd uses (rmcp), then through agentd as `tool/invoke` of
//! `mcp__everything__echo`. The difference between the two is what agentd adds to an MCP call.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;

use crate::Settings;
use crate::child::ServerProcess;
use crate::client::RpcClient;
use crate::report::{Latencies, Measured, Table, nanos, ratio, us};

/// Calls measured each way unless --requests says otherwise.
const MCP_REQUESTS: u64 = 2_000;
/// The arguments of every call.
const ECHO_ARGUMENTS: &str = r#"{"message":"hello, load"}"#;

/// `mcp`: direct calls, then calls through agentd, of the same server's `echo`.
pub async fn run(settings: &Settings) -> anyhow::Result<()> {
    let requests = settings.requests_or(MCP_REQUESTS);
    let warmup = settings.warmup(requests);
    let script = &settings.mcp_server;
    anyhow::ensure!(
        script.exists(),
        "{} is missing: install it with `npm install --prefix target/mcp-servers \
         @modelcontextprotocol/server-everything@2026.8.31` (./scripts/test does), or pass \
         --mcp-server",
        script.display()
    );
    println!("### mcp: sequential calls of server-everything's `echo` over stdio");
    println!();
    println!(
        "{requests} measured calls each way after {warmup} unmeasured; directly with rmcp, then \
         through agentd (`tool/invoke` of `mcp__everything__echo`, one connection, server \
         scoped, sandboxed); agentd on {}.",
        settings.backend()
    );
    println!();
    let direct = direct(script, requests, warmup).await?;
    let through = through_agentd(settings, script, requests, warmup).await?;
    let mut table = Table::new(&[
        "path",
        "calls",
        "p50 µs",
        "p90 µs",
        "p99 µs",
        "agentd CPU µs/call",
    ]);
    let row = |label: &str, latencies: &Latencies, cpu: String| {
        vec![
            label.to_string(),
            latencies.len().to_string(),
            us(latencies.quantile(0.5)),
            us(latencies.quantile(0.9)),
            us(latencies.quantile(0.99)),
            cpu,
        ]
    };
    table.row(row("direct (rmcp client)", &direct, String::new()));
    table.row(row(
        "through agentd",
        &through.latencies,
        us(through.cpu_per_request()),
    ));
    let q = |latencies: &Latencies, q: f64| latencies.quantile(q).as_secs_f64();
    table.row(vec![
        "through ÷ direct".into(),
        String::new(),
        ratio(q(&through.latencies, 0.5), q(&direct, 0.5)),
        ratio(q(&through.latencies, 0.9), q(&direct, 0.9)),
        ratio(q(&through.latencies, 0.99), q(&direct, 0.99)),
        String::new(),
    ]);
    table.print();
    let overhead = through.latencies.p50().saturating_sub(direct.p50());
    println!();
    println!("agentd's overhead per MCP call, p50: {} µs.", us(overhead));
    println!();
    Ok(())
}

/// The server started by this process, unconfined, and called with no one in between.
async fn direct(script: &Path, requests: u64, warmup: u64) -> anyhow::Result<Latencies> {
    let mut command = tokio::process::Command::new("node");
    command
        .arg(script)
        .arg("stdio")
        .stderr(std::process::Stdio::null());
    let transport = TokioChildProcess::new(command).context("cannot start node")?;
    let service = ().serve(transport).await.context("the MCP handshake failed")?;
    let arguments: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(ECHO_ARGUMENTS)?;
    let call = || {
        let mut params = CallToolRequestParams::new("echo");
        params.arguments = Some(arguments.clone());
        service.peer().call_tool(params)
    };
    for _ in 0..warmup {
        call().await.context("echo failed")?;
    }
    let mut samples = Vec::with_capacity(requests as usize);
    for _ in 0..requests {
        let sent = Instant::now();
        let answer = call().await.context("echo failed")?;
        samples.push(nanos(sent.elapsed()));
        anyhow::ensure!(answer.is_error != Some(true), "echo answered an error");
    }
    service.cancel().await.ok();
    Ok(Latencies::new(samples))
}

/// agentd with the same server configured, called over its WebSocket.
async fn through_agentd(
    settings: &Settings,
    script: &Path,
    requests: u64,
    warmup: u64,
) -> anyhow::Result<Measured> {
    let installed = script
        .ancestors()
        .find(|dir| dir.ends_with("node_modules"))
        .and_then(Path::parent)
        .unwrap_or(script);
    let config = format!(
        "[[mcp_servers]]\nname = \"everything\"\ncommand = \"node\"\nargs = [{script:?}, \
         \"stdio\"]\nscope = \"server\"\ndefer = false\n\n[sandbox]\nextra_read = [{installed:?}]\n",
        script = script.to_string_lossy(),
        installed = installed.to_string_lossy(),
    );
    let agentd = ServerProcess::agentd_configured(settings, None, &config).await?;
    let mut client = RpcClient::connect(agentd.addr()).await?;
    client.open().await?;
    for _ in 0..warmup {
        client
            .invoke_tool("mcp__everything__echo", ECHO_ARGUMENTS)
            .await?;
    }
    let measured = Measured::sequential(&agentd, requests, async || {
        client
            .invoke_tool("mcp__everything__echo", ECHO_ARGUMENTS)
            .await
    })
    .await?;
    client.close().await?;
    agentd.stop().await?;
    Ok(measured)
}
