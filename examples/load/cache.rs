//! `cache`: one long session against the mock's Anthropic API, every turn two tool calls then a
//! text as in a coding session, reporting per turn the share of prompt tokens read from the
//! prompt cache (as the mock accounts it) and, when it is low, where the prefix changed.

use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;

use crate::Settings;
use crate::child::ServerProcess;
use crate::client::RpcClient;
use crate::mock_model::{CacheRecord, CacheTotals, MODEL, MockModel, Place};
use crate::report::{Latencies, Table, count, nanos};
use crate::turns::{turn_completed, with_server_state};

/// Turns of the session unless --requests says otherwise.
const TURNS: u64 = 30;
/// Turns of the session in a smoke run: the first reads the tools, the third the history.
const SMOKE_TURNS: u64 = 3;
/// What the user says each turn: two `read_file` calls, then the mock's text.
const INPUT: &str = "tools 2";
/// The share of prompt tokens read from the cache aimed at, from the third turn on.
const GOAL: f64 = 0.9;
/// Turns before the share is judged: the first writes the tools and system prompt, the second
/// is the first to read a conversation.
const SETTLING_TURNS: usize = 2;

/// The `[llm]` configuration of one Anthropic provider `mock` at `base_url`, its model the
/// default.
pub fn anthropic_config(base_url: &str) -> String {
    format!(
        "[llm]\nmodel = \"mock/{MODEL}\"\n\n[[llm.providers]]\nname = \"mock\"\nkind = \"anthropic\"\n\
         base_url = \"{base_url}\"\n"
    )
}

/// The fields of `turn/completed` compared with the mock's usage.
#[derive(Debug, Deserialize)]
struct Completed {
    #[serde(default)]
    tokens_in: u64,
    #[serde(default)]
    tokens_cached: u64,
}

/// One turn of the session as the mock and agentd saw it.
struct TurnFigures {
    elapsed: Duration,
    /// The mock's usage of the turn's requests, added up.
    tokens: CacheTotals,
    /// How each request went through the cache.
    requests: Vec<CacheRecord>,
    /// What agentd's `turn/completed` said.
    completed: Completed,
}

/// Runs the session and prints the table.
pub async fn run(settings: &Settings) -> anyhow::Result<()> {
    let turns = settings.requests_or_smoke(TURNS, SMOKE_TURNS);
    println!("### cache: prompt-cache reads of one long session against a mock Anthropic API");
    println!();
    println!(
        "One session of {turns} turns, each `{INPUT}` (two `read_file` calls, then a text), \
         through agentd's Anthropic adapter to the in-process mock, which accounts the prompt \
         cache as Anthropic does: the canonical JSON of tools, system and messages in that \
         order, every `cache_control` block's prefix an entry, a request reading the longest \
         entry at one of its breakpoints or up to 20 blocks before one; tokens are bytes / 4. \
         agentd on {}.",
        settings.backend()
    );
    println!();
    let mock = MockModel::start().await?;
    let config = anthropic_config(&mock.base_url());
    let mut agentd = ServerProcess::agentd_configured(settings, None, &config).await?;
    let mut client = RpcClient::connect(agentd.addr()).await?;
    let session = client.open().await?;
    let mut figures = Vec::with_capacity(turns as usize);
    mock.take_cache_log();
    for _ in 0..turns {
        let before = mock.cache_totals();
        let outcome = turn_completed(&mut client, &session, INPUT, None).await;
        let (elapsed, params) = outcome.map_err(|err| with_server_state(err, &mut agentd))?;
        let completed: Completed =
            serde_json::from_str(&params).context("turn/completed params")?;
        figures.push(TurnFigures {
            elapsed,
            tokens: mock.cache_totals().since(&before),
            requests: mock.take_cache_log(),
            completed,
        });
    }
    client.close().await?;
    agentd.stop().await?;
    print_report(&figures);
    Ok(())
}

/// A share as a percentage with one decimal.
fn percent(share: f64) -> String {
    format!("{:.1} %", share * 100.0)
}

/// The places of a turn's requests, `–` for none, joined by ` / `.
fn places(requests: &[CacheRecord], pick: impl Fn(&CacheRecord) -> Option<Place>) -> String {
    requests
        .iter()
        .map(|record| pick(record).map_or("–".to_string(), |place| place.to_string()))
        .collect::<Vec<_>>()
        .join(" / ")
}

/// One row of token figures.
fn token_row(label: String, requests: u64, tokens: &CacheTotals) -> Vec<String> {
    vec![
        label,
        count(requests),
        count(tokens.prompt()),
        count(tokens.cache_read),
        count(tokens.cache_creation),
        count(tokens.input),
        percent(tokens.read_share()),
    ]
}

fn print_report(figures: &[TurnFigures]) {
    let mut table = Table::new(&[
        "turn",
        "requests",
        "prompt tokens",
        "cache read",
        "cache write",
        "uncached",
        "read share",
        "read through",
        "first change",
        "turn ms",
    ]);
    for (index, turn) in figures.iter().enumerate() {
        let mut row = token_row((index + 1).to_string(), turn.tokens.requests, &turn.tokens);
        row.extend([
            places(&turn.requests, |record| record.read_through),
            places(&turn.requests, |record| record.first_change),
            format!("{:.2}", turn.elapsed.as_secs_f64() * 1e3),
        ]);
        table.row(row);
    }
    let sum = |turns: &[TurnFigures]| {
        turns.iter().fold(CacheTotals::default(), |total, turn| {
            total.plus(&turn.tokens)
        })
    };
    let settled = figures.get(SETTLING_TURNS..).unwrap_or_default();
    let settled_total = sum(settled);
    let all_total = sum(figures);
    if !settled.is_empty() {
        table.row(token_row(
            format!("turns {}–{}", SETTLING_TURNS + 1, figures.len()),
            settled_total.requests,
            &settled_total,
        ));
    }
    table.row(token_row(
        "all turns".to_string(),
        all_total.requests,
        &all_total,
    ));
    table.print();
    println!();
    println!(
        "\"read through\" is the last block of the prefix each request of the turn read from the \
         cache; \"first change\" the first block that differs from the previous request's at the \
         same position (– when the request only extends the previous one)."
    );
    println!();
    let latencies = Latencies::new(figures.iter().map(|turn| nanos(turn.elapsed)).collect());
    if settled.is_empty() {
        println!(
            "Read share over all {} turns: {} (too few turns to judge the goal of {} from turn {}).",
            figures.len(),
            percent(all_total.read_share()),
            percent(GOAL),
            SETTLING_TURNS + 1,
        );
    } else {
        let met = settled_total.read_share() >= GOAL;
        println!(
            "From turn {} on, {} of prompt tokens were read from the cache (goal ≥ {}: {}); \
             turn p50 {:.2} ms.",
            SETTLING_TURNS + 1,
            percent(settled_total.read_share()),
            percent(GOAL),
            if met { "met" } else { "not met" },
            latencies.p50().as_secs_f64() * 1e3,
        );
        if !met {
            explain(figures);
        }
    }
    check_agentd_usage(figures);
}

/// Says why the first turn past the settling ones that read too little did.
fn explain(figures: &[TurnFigures]) {
    let worst = figures
        .iter()
        .enumerate()
        .skip(SETTLING_TURNS)
        .flat_map(|(turn, figures)| figures.requests.iter().map(move |record| (turn, record)))
        .find(|(_, record)| record.tokens.read_share() < GOAL);
    let Some((turn, record)) = worst else {
        return;
    };
    let breakpoints = record
        .breakpoints
        .iter()
        .map(Place::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    println!();
    println!(
        "First request under the goal: turn {}, {} blocks, breakpoints at {breakpoints}, read \
         through {}, first change {}.",
        turn + 1,
        record.blocks,
        record
            .read_through
            .map_or("nothing".to_string(), |place| place.to_string()),
        record
            .first_change
            .map_or("none".to_string(), |place| place.to_string()),
    );
    let why = match record.first_change {
        Some(Place::Tool(_)) => {
            "the tool list is not byte-stable across requests: everything after the changed tool \
             is written again"
        }
        Some(Place::System(_)) => {
            "the system prompt is not byte-stable across requests: everything after it is \
             written again"
        }
        Some(Place::Message(..)) => {
            "an earlier message was sent differently than before: everything after it is written \
             again"
        }
        None => {
            "the prefix is unchanged, but no breakpoint of this request lies at or within 20 \
             blocks after the previous request's last breakpoint, so the cached prefix is not \
             found"
        }
    };
    println!("Why: {why}.");
}

/// Compares agentd's `turn/completed` token counts with the usage the mock sent.
fn check_agentd_usage(figures: &[TurnFigures]) {
    let wrong: Vec<String> = figures
        .iter()
        .enumerate()
        .filter(|(_, turn)| {
            turn.completed.tokens_in != turn.tokens.prompt()
                || turn.completed.tokens_cached != turn.tokens.cache_read
        })
        .map(|(index, turn)| {
            format!(
                "turn {}: tokens_in {} (mock {}), tokens_cached {} (mock {})",
                index + 1,
                turn.completed.tokens_in,
                turn.tokens.prompt(),
                turn.completed.tokens_cached,
                turn.tokens.cache_read
            )
        })
        .collect();
    println!();
    if wrong.is_empty() {
        println!(
            "agentd's turn/completed `tokens_in` and `tokens_cached` match the mock's usage \
             (input + cache read + cache write, and cache read) on all {} turns.",
            figures.len()
        );
    } else {
        println!(
            "agentd's turn/completed token counts differ from the mock's usage on {} of {} turns: {}.",
            wrong.len(),
            figures.len(),
            wrong.join("; ")
        );
    }
}
