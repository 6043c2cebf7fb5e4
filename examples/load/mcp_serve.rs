//! `mcp-serve`: agentd's own MCP endpoint. The same tool (`read_file` of a 12-byte file) is
//! called sequentially over the WebSocket (`tool/invoke`) and over `/mcp` (`tools/call`, rmcp's
//! streamable-HTTP client, one MCP session) of the same server: the difference is what MCP's
//! HTTP transport costs beside the WebSocket.

use anyhow::Context;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

use crate::Settings;
use crate::child::{READ_FILE, ServerProcess};
use crate::client::RpcClient;
use crate::report::{Latencies, Measured, Table, ratio, us};

/// Calls measured each way unless --requests says otherwise.
const MCP_SERVE_REQUESTS: u64 = 2_000;

/// `mcp-serve`: `tool/invoke` over the WebSocket, then `tools/call` over `/mcp`.
pub async fn run(settings: &Settings) -> anyhow::Result<()> {
    let requests = settings.requests_or(MCP_SERVE_REQUESTS);
    let warmup = settings.warmup(requests);
    println!("### mcp-serve: sequential calls of read_file (12 bytes), WebSocket vs /mcp");
    println!();
    println!(
        "{requests} measured calls each way after {warmup} unmeasured, on one agentd: \
         `tool/invoke` over one WebSocket, then `tools/call` over `/mcp` (rmcp's streamable-HTTP \
         client, one MCP session, each answer an SSE stream); agentd on {}.",
        settings.backend()
    );
    println!();
    let agentd = ServerProcess::agentd(settings, None).await?;
    let mut client = RpcClient::connect(agentd.addr()).await?;
    client.open().await?;
    for _ in 0..warmup {
        client.invoke().await?;
    }
    let websocket = Measured::sequential(&agentd, requests, async || client.invoke().await).await?;
    client.close().await?;

    let config =
        StreamableHttpClientTransportConfig::with_uri(format!("http://{}/mcp", agentd.addr()));
    let transport = StreamableHttpClientTransport::with_client(reqwest::Client::new(), config);
    let service = ().serve(transport).await.context("the MCP handshake failed")?;
    let arguments: serde_json::Map<String, serde_json::Value> =
        serde_json::from_value(serde_json::json!({ "path": READ_FILE }))?;
    let call = async || {
        let mut params = CallToolRequestParams::new("read_file");
        params.arguments = Some(arguments.clone());
        let answer = service
            .peer()
            .call_tool(params)
            .await
            .context("tools/call failed")?;
        anyhow::ensure!(answer.is_error != Some(true), "read_file answered an error");
        Ok(())
    };
    for _ in 0..warmup {
        call().await?;
    }
    let mcp = Measured::sequential(&agentd, requests, call).await?;
    service.cancel().await.ok();
    agentd.stop().await?;

    let mut table = Table::new(&[
        "path",
        "calls",
        "p50 µs",
        "p90 µs",
        "p99 µs",
        "agentd CPU µs/call",
    ]);
    let row = |label: &str, run: &Measured| {
        vec![
            label.to_string(),
            run.latencies.len().to_string(),
            us(run.latencies.quantile(0.5)),
            us(run.latencies.quantile(0.9)),
            us(run.latencies.quantile(0.99)),
            us(run.cpu_per_request()),
        ]
    };
    table.row(row("tool/invoke over the WebSocket", &websocket));
    table.row(row("tools/call over /mcp", &mcp));
    let q = |latencies: &Latencies, q: f64| latencies.quantile(q).as_secs_f64();
    table.row(vec![
        "/mcp ÷ WebSocket".into(),
        String::new(),
        ratio(q(&mcp.latencies, 0.5), q(&websocket.latencies, 0.5)),
        ratio(q(&mcp.latencies, 0.9), q(&websocket.latencies, 0.9)),
        ratio(q(&mcp.latencies, 0.99), q(&websocket.latencies, 0.99)),
        String::new(),
    ]);
    table.print();
    println!();
    Ok(())
}
