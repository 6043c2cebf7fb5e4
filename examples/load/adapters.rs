//! `adapters`: turn overhead through each model API adapter (OpenAI chat completions, OpenAI
//! Responses, Anthropic Messages) against the in-process mock, measured as `turns` measures it,
//! with each adapter's overhead beside the chat adapter's.

use crate::Settings;
use crate::child::ServerProcess;
use crate::client::RpcClient;
use crate::mock_model::{MODEL, MockModel};
use crate::report::{Table, count, us};
use crate::turns::{TurnRun, measure, with_server_state};

/// Turns of each kind and adapter unless --requests says otherwise.
const TURNS: u64 = 200;
/// The same in a smoke run.
const SMOKE_TURNS: u64 = 3;
/// Most unmeasured turns of each kind.
const MAX_WARMUP: u64 = 20;
/// Tool calls of a tool turn: as many as the `cache` session's turns make.
const TOOL_CALLS: usize = 2;
/// The providers configured: name (the model's prefix) and kind, chat first as the reference.
const ADAPTERS: [(&str, &str); 3] = [
    ("chat", "openai-chat"),
    ("responses", "openai-responses"),
    ("anthropic", "anthropic"),
];

/// The `[llm]` configuration of the three providers, all at the mock.
fn config(base_url: &str) -> String {
    let mut text = format!("[llm]\nmodel = \"{}/{MODEL}\"\n", ADAPTERS[0].0);
    for (name, kind) in ADAPTERS {
        text.push_str(&format!(
            "\n[[llm.providers]]\nname = \"{name}\"\nkind = \"{kind}\"\nbase_url = \"{base_url}\"\n"
        ));
    }
    text
}

/// Measures text turns and tool turns through every adapter on one agentd.
pub async fn run(settings: &Settings) -> anyhow::Result<()> {
    let turns = settings.requests_or_smoke(TURNS, SMOKE_TURNS);
    let warmup = settings.warmup(turns).min(MAX_WARMUP);
    println!("### adapters: turn overhead through each model API adapter");
    println!();
    println!(
        "{turns} measured turns of each kind and adapter after {warmup} unmeasured, one at a \
         time, each on a fresh session, as in `turns`; one agentd on {} with three providers at \
         the same in-process mock, the turn's `model` choosing one. The mock's time is its \
         recorded requests replayed by a bare HTTP client; the overhead is the p50 less it.",
        settings.backend()
    );
    println!();
    let mock = MockModel::start().await?;
    let config = config(&mock.base_url());
    let mut agentd = ServerProcess::agentd_configured(settings, None, &config).await?;
    let mut client = RpcClient::connect(agentd.addr()).await?;
    let tools_input = format!("tools {TOOL_CALLS}");
    let mut runs: Vec<(&str, TurnRun, TurnRun)> = Vec::new();
    for (name, _) in ADAPTERS {
        let model = format!("{name}/{MODEL}");
        let mut kind = async |input: &str| {
            measure(
                &agentd,
                &mut client,
                &mock,
                input,
                Some(&model),
                turns,
                warmup,
            )
            .await
        };
        let text = kind("text").await;
        let tools = kind(&tools_input).await;
        let (text, tools) = match (text, tools) {
            (Ok(text), Ok(tools)) => (text, tools),
            (Err(err), _) | (_, Err(err)) => {
                return Err(with_server_state(err.context(model), &mut agentd));
            }
        };
        runs.push((name, text, tools));
    }
    client.close().await?;
    agentd.stop().await?;

    let mut table = Table::new(&[
        "adapter",
        "turn",
        "turns",
        "p50 µs",
        "p90 µs",
        "CPU µs/turn",
        "model calls/turn",
        "mock µs/turn",
        "overhead p50 µs",
        "÷ chat",
    ]);
    let chat = (runs[0].1.overhead(), runs[0].2.overhead());
    for (name, text, tools) in &runs {
        for (label, run, reference) in [
            ("text", text, chat.0),
            (&format!("{TOOL_CALLS} tool calls")[..], tools, chat.1),
        ] {
            let latencies = &run.measured.latencies;
            table.row(vec![
                (*name).to_string(),
                label.to_string(),
                count(latencies.len() as u64),
                us(latencies.p50()),
                us(latencies.quantile(0.9)),
                us(run.measured.cpu_per_request()),
                format!("{:.2}", run.model_calls_per_turn),
                us(run.mock_per_turn),
                us(run.overhead()),
                format!(
                    "{:.2}×",
                    run.overhead().as_secs_f64() / reference.as_secs_f64().max(1e-9)
                ),
            ]);
        }
    }
    table.print();
    println!();
    println!(
        "\"÷ chat\" is the overhead divided by the chat adapter's for the same kind of turn. The \
         Anthropic mock also does its prompt-cache accounting in each answer, replays included, \
         so it is inside the mock's time, not the overhead."
    );
    Ok(())
}
