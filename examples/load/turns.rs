//! `turns`: turn/start → turn/completed against the in-process zero-latency model, text only and
//! with K tool calls. The reference is the mock's own time per turn (its answers replayed by a
//! bare HTTP client), not the floor: what remains is agentd's overhead.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::Settings;
use crate::child::ServerProcess;
use crate::client::{Incoming, RpcClient};
use crate::mock_model::{MODEL, MockModel};
use crate::report::{Latencies, Measured, Table, latency_row, nanos, us};

/// Turns of each kind unless --requests says otherwise.
const TURNS: u64 = 500;
/// Most unmeasured turns of each kind.
const MAX_WARMUP: u64 = 50;
/// Most replays of each recorded model request.
const MAX_REPLAYS: usize = 200;

/// One kind of turn measured.
pub struct TurnRun {
    /// The turns' latencies and the server's CPU time around them.
    pub measured: Measured,
    /// Model requests per turn.
    pub model_calls_per_turn: f64,
    /// p50 of the replayed model calls of one turn, summed.
    pub mock_per_turn: Duration,
}

impl TurnRun {
    /// Median turn time beyond the mock's.
    pub fn overhead(&self) -> Duration {
        self.measured
            .latencies
            .p50()
            .saturating_sub(self.mock_per_turn)
    }
}

/// Measures text turns, then turns with K tool calls, on one agentd.
pub async fn run(settings: &Settings) -> anyhow::Result<()> {
    let turns = settings.requests_or(TURNS);
    let warmup = settings.warmup(turns).min(MAX_WARMUP);
    let k = settings.tool_calls;
    println!("### turns: turn/start → turn/completed against a zero-latency in-process model");
    println!();
    println!(
        "{turns} measured turns of each kind after {warmup} unmeasured, one at a time, each on a \
         fresh session (opened beforehand) so that every conversation is one turn long; agentd \
         on {}. The mock's time is its recorded requests replayed by a bare HTTP client.",
        settings.backend()
    );
    println!();
    let mock = MockModel::start().await?;
    let base_url = mock.base_url();
    let mut agentd = ServerProcess::agentd(settings, Some((&base_url, MODEL))).await?;
    let mut client = RpcClient::connect(agentd.addr()).await?;
    let text = measure(&agentd, &mut client, &mock, "text", None, turns, warmup).await;
    let text = text.map_err(|err| with_server_state(err, &mut agentd))?;
    let input = format!("tools {k}");
    let tools = measure(&agentd, &mut client, &mock, &input, None, turns, warmup).await;
    let tools = tools.map_err(|err| with_server_state(err, &mut agentd))?;
    client.close().await?;
    agentd.stop().await?;

    let mut table = Table::new(&[
        "turn",
        "turns",
        "p50 µs",
        "p90 µs",
        "p99 µs",
        "p99.9 µs",
        "turns/s",
        "CPU µs/turn",
        "model calls/turn",
        "mock µs/turn",
        "overhead p50 µs",
    ]);
    for (label, run) in [("text", &text), (&format!("{k} tool calls")[..], &tools)] {
        // The common latency columns, less the RSS one this table does not show.
        let mut row = latency_row(label, &run.measured);
        row.pop();
        row.extend([
            format!("{:.2}", run.model_calls_per_turn),
            us(run.mock_per_turn),
            us(run.overhead()),
        ]);
        table.row(row);
    }
    table.print();
    println!();
    let per_call = tools
        .overhead()
        .saturating_sub(text.overhead())
        .div_f64(k as f64);
    println!(
        "Overhead per tool call: ({} − {}) / {k} = {} µs (it carries the second model call's \
         own overhead, spread over the {k} calls).",
        us(tools.overhead()),
        us(text.overhead()),
        us(per_call)
    );
    Ok(())
}

/// Adds the server's last log lines when it died under the turn.
pub fn with_server_state(err: anyhow::Error, server: &mut ServerProcess) -> anyhow::Error {
    match server.check_alive() {
        Ok(()) => err,
        Err(dead) => err.context(dead),
    }
}

/// Runs `warmup` turns, then `turns` measured ones, each on a fresh session, all with `input`
/// and on `model` (the session's default when `None`); then replays the last turn's model
/// requests to time the mock's share.
pub async fn measure(
    server: &ServerProcess,
    client: &mut RpcClient,
    mock: &MockModel,
    input: &str,
    model: Option<&str>,
    turns: u64,
    warmup: u64,
) -> anyhow::Result<TurnRun> {
    for _ in 0..warmup {
        let session = client.open().await?;
        turn(client, &session, input, model).await?;
    }
    let mut sessions = Vec::with_capacity(turns as usize);
    for _ in 0..turns {
        sessions.push(client.open().await?);
    }
    let calls_before = mock.calls();
    let before = server.usage()?;
    let started = Instant::now();
    let mut samples = Vec::with_capacity(sessions.len());
    let last = sessions.len() - 1;
    for (index, session) in sessions.iter().enumerate() {
        if index == last {
            // Only the last turn's requests are kept for the replay; every turn sends the same.
            mock.clear();
        }
        samples.push(nanos(turn(client, session, input, model).await?));
    }
    let elapsed = started.elapsed();
    let after = server.usage()?;
    let model_calls = mock.calls() - calls_before;
    let requests = mock.take();
    let rounds = (turns as usize).clamp(5, MAX_REPLAYS);
    let mut mock_per_turn = Duration::ZERO;
    for request in &requests {
        mock_per_turn += mock.replay(request, rounds).await?.p50();
    }
    Ok(TurnRun {
        measured: Measured {
            latencies: Latencies::new(samples),
            elapsed,
            before,
            after,
        },
        model_calls_per_turn: model_calls as f64 / turns as f64,
        mock_per_turn,
    })
}

/// One turn: from sending turn/start until turn/completed arrives.
pub async fn turn(
    client: &mut RpcClient,
    session: &str,
    input: &str,
    model: Option<&str>,
) -> anyhow::Result<Duration> {
    Ok(turn_completed(client, session, input, model).await?.0)
}

/// One turn, with its `turn/completed` params (JSON text).
pub async fn turn_completed(
    client: &mut RpcClient,
    session: &str,
    input: &str,
    model: Option<&str>,
) -> anyhow::Result<(Duration, String)> {
    let model = match model {
        Some(model) => format!(r#","model":{}"#, serde_json::to_string(model)?),
        None => String::new(),
    };
    let params = format!(
        r#"{{"session_id":{},"input":[{{"kind":"text","text":{}}}]{model}}}"#,
        serde_json::to_string(session)?,
        serde_json::to_string(input)?
    );
    let started = Instant::now();
    let id = client.send("turn/start", &params).await?;
    loop {
        let text = client.next_text().await?;
        let message: Incoming<'_> =
            serde_json::from_str(text.as_str()).context("a frame is not JSON-RPC")?;
        if message.id == Some(id) {
            if let Some(error) = message.error {
                bail!("turn/start failed: {}", error.get());
            }
            continue;
        }
        match message.method {
            Some("turn/completed") => {
                let params = message.params.map_or("null", |params| params.get());
                return Ok((started.elapsed(), params.to_string()));
            }
            Some("turn/error") => bail!(
                "the turn failed: {}",
                message.params.map_or("", |params| params.get())
            ),
            _ => {}
        }
    }
}
