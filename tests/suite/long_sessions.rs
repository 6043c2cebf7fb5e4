//! Long sessions: the loop breaker, the spend-rate guard, cached-token pricing, compaction and
//! the tool list's stability. The scripted model records every request, so the tests assert on
//! what it was told and when it was stopped.

use agentd::config::Config;
use serde_json::{Value, json};

use super::agent::{MODEL, run_turn, tool_names, with_model};
use crate::support::TestApp;
use crate::support::mock_llm::{MockLlm, Reply, Script, ScriptedCall};

/// The content of a request's last message.
fn last_content(request: &Value) -> String {
    request["messages"].as_array().unwrap().last().unwrap()["content"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn a_model_repeating_the_same_call_is_told_then_stopped() {
    let mock = MockLlm::start(Script::always(Reply::tool_calls(vec![
        ScriptedCall::whole("again", "read_file", &json!({"path": "same.txt"})),
    ])))
    .await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    std::fs::write(app.workspace().join("same.txt"), "nothing new\n").unwrap();
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (_, end) = run_turn(&mut ws, &session, "read it").await;
    assert_eq!(end["reason"], "stuck_in_loop", "{end}");
    // Three in a row and the model is told; six and the turn ends.
    let requests = mock.requests();
    assert_eq!(requests.len(), 6);
    assert!(!last_content(&requests[2]).contains("[agentd]"));
    assert!(
        last_content(&requests[3]).contains("3 times in a row"),
        "{}",
        last_content(&requests[3])
    );

    // A turn that answers ends as completed.
    let answering = MockLlm::start(Script::always(Reply::text(&["done"]))).await;
    let app = TestApp::spawn_with(with_model(&answering)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (_, end) = run_turn(&mut ws, &session, "hi").await;
    assert_eq!(end["reason"], "completed", "{end}");
}

#[tokio::test]
async fn cached_prompt_tokens_are_stored_priced_and_reported() {
    // Two calls: the first reads a file (600 of 1000 prompt tokens cached), the second answers
    // (900 of 1500 cached).
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::tool_calls(vec![ScriptedCall::whole(
            "c1",
            "read_file",
            &json!({"path": "a.txt"}),
        )])
        .with_usage(1000, 10)
        .with_cached(600),
        Reply::text(&["done"]).with_usage(1500, 20).with_cached(900),
    ]))
    .await;
    let configure = with_model(&mock);
    let app = TestApp::spawn_with(move |c: &mut Config| {
        configure(c);
        // 1 USD per million prompt tokens, 0.1 per million cached ones, 2 per million out.
        c.llm.pricing.get_mut(MODEL).unwrap().cached_input_per_mtok = Some(0.1);
    })
    .await;
    std::fs::write(app.workspace().join("a.txt"), "a\n").unwrap();
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (_, end) = run_turn(&mut ws, &session, "read a").await;
    assert_eq!(end["tokens_in"], 2500, "{end}");
    assert_eq!(end["tokens_cached"], 1500, "{end}");
    let expected = (1000.0 * 1.0 + 1500.0 * 0.1 + 30.0 * 2.0) / 1e6;
    let cost = end["cost_usd"].as_f64().unwrap();
    assert!((cost - expected).abs() < 1e-12, "{cost} vs {expected}");

    let cost = app
        .get_json(&format!("/api/sessions/{session}/cost"), None)
        .await;
    assert_eq!(cost["tokens_cached"], 1500, "{cost}");
    let rows = cost["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["tokens_cached"], 600);
    assert_eq!(rows[1]["tokens_cached"], 900);
    let first = rows[0]["actual_usd"].as_f64().unwrap();
    assert!(
        (first - (400.0 + 60.0 + 20.0) / 1e6).abs() < 1e-12,
        "{first}"
    );

    // The reservation still assumed nothing was cached: the whole prompt at the input price.
    let reserved = rows[0]["reserved_usd"].as_f64().unwrap();
    assert!(reserved > first * 2.0, "{reserved} vs {first}");
}

/// A model that reads a file on every call, each costing 1000 prompt and 20 completion
/// tokens, and a server (priced by `configure_model`) allowing 0.001 USD a minute: less than
/// one call costs at any price the tests use.
pub(crate) async fn a_fast_spender<F: FnOnce(&mut Config)>(
    configure_model: impl FnOnce(&MockLlm) -> F,
) -> (MockLlm, TestApp) {
    let mock = MockLlm::start(Script::always(
        Reply::tool_calls(vec![ScriptedCall::whole(
            "c",
            "read_file",
            &json!({"path": "a.txt"}),
        )])
        .with_usage(1000, 20),
    ))
    .await;
    let configure = configure_model(&mock);
    let app = TestApp::spawn_with(move |c: &mut Config| {
        configure(c);
        c.budget.usd_per_minute = 0.001;
    })
    .await;
    std::fs::create_dir_all(app.workspace()).unwrap();
    std::fs::write(app.workspace().join("a.txt"), "a\n").unwrap();
    (mock, app)
}

#[tokio::test]
async fn a_session_spending_faster_than_its_rate_is_paused() {
    // 1000 prompt tokens at 1 USD per million plus 20 out at 2: 0.00104 USD a call.
    let (mock, app) = a_fast_spender(with_model).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (notes, end) = run_turn(&mut ws, &session, "go").await;
    assert_eq!(end["reason"], "budget_rate_exceeded", "{end}");
    assert_eq!(
        mock.request_count(),
        1,
        "the second call waits for the rate"
    );
    // The call that was made still got its answer into the history.
    assert!(
        notes.iter().any(|n| n["method"] == "tool/completed"),
        "{notes:?}"
    );
    // Within the same minute a new turn is paused before it calls the model at all.
    let (_, end) = run_turn(&mut ws, &session, "go on").await;
    assert_eq!(end["reason"], "budget_rate_exceeded", "{end}");
    assert_eq!(mock.request_count(), 1);
    let cost = app
        .get_json(&format!("/api/sessions/{session}/cost"), None)
        .await;
    assert_eq!(cost["rows"].as_array().unwrap().len(), 1, "{cost}");
}

/// The turn number a request belongs to, from its last user message (`turn N`).
fn turn_of(request: &Value) -> u32 {
    last_user(request)
        .strip_prefix("turn ")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn the_tool_list_stays_byte_identical_across_a_long_session() {
    // Fifty turns of two tool calls and an answer. Turn 10 calls a deferred sessions tool and
    // turn 25 a deferred web tool, which brings them back; the rest use everyday tools.
    let mock = MockLlm::start(Script::route(|request| {
        let messages = request["messages"].as_array().unwrap();
        let answered = messages
            .iter()
            .rev()
            .take_while(|m| m["role"] != "user")
            .filter(|m| m["role"] == "tool")
            .count();
        let turn = turn_of(request);
        let (name, arguments) = match (answered, turn) {
            (2, _) => return Reply::text(&["ok"]),
            (1, _) => ("read_file", json!({"path": "a.txt"})),
            (_, 10) => ("wait_agent", json!({"ids": ["nobody"], "timeout_ms": 1})),
            (_, 25) => ("web_fetch", json!({"url": "http://127.0.0.1:9/"})),
            (_, n) if n % 2 == 0 => ("grep", json!({"pattern": "a"})),
            _ => ("list_dir", json!({"path": "."})),
        };
        Reply::tool_calls(vec![ScriptedCall::whole(
            &format!("call_{turn}_{answered}"),
            name,
            &arguments,
        )])
    }))
    .await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    std::fs::write(app.workspace().join("a.txt"), "a\n").unwrap();
    let mut ws = app.ws().await;
    let session = ws.open().await;
    for turn in 1..=50 {
        let (_, end) = run_turn(&mut ws, &session, &format!("turn {turn}")).await;
        assert_eq!(end["reason"], "completed", "turn {turn}: {end}");
    }
    let requests = mock.requests();
    assert_eq!(requests.len(), 150);
    let tools: Vec<String> = requests.iter().map(|r| r["tools"].to_string()).collect();
    let names: Vec<Vec<String>> = requests.iter().map(tool_names).collect();
    let same = tools.windows(2).filter(|pair| pair[0] == pair[1]).count();
    let share = same as f64 / (tools.len() - 1) as f64;
    let changes: Vec<u32> = (1..tools.len())
        .filter(|&i| tools[i] != tools[i - 1])
        .map(|i| turn_of(&requests[i]))
        .collect();
    println!(
        "tool list unchanged in {same} of {} request pairs ({:.1}%), changed at turns {changes:?}",
        tools.len() - 1,
        share * 100.0
    );
    assert!(share >= 0.98, "{share}: changed at turns {changes:?}");
    // The list changed only where the model brought tools back, and then at once: the
    // evictions that made room went with the same change.
    assert_eq!(changes, [10, 25]);
    // The deferred groups did come back when called.
    assert!(
        names[30].contains(&"wait_agent".to_string()),
        "{:?}",
        names[30]
    );
    assert!(
        names[75].contains(&"web_fetch".to_string()),
        "{:?}",
        names[75]
    );
    assert!(
        !names[0].contains(&"wait_agent".to_string()),
        "{:?}",
        names[0]
    );
    for pair in names.windows(2) {
        // The tools both lists share are in the same order: changes append or remove.
        let kept_before: Vec<&String> = pair[0].iter().filter(|n| pair[1].contains(n)).collect();
        let kept_after: Vec<&String> = pair[1].iter().filter(|n| pair[0].contains(n)).collect();
        assert_eq!(
            kept_before, kept_after,
            "reordered: {:?} -> {:?}",
            pair[0], pair[1]
        );
    }
    for (request, names) in requests.iter().zip(&names) {
        // At each turn's first request the LRU's limit holds (the deferral tool takes no slot).
        if request["messages"].as_array().unwrap().last().unwrap()["role"] == "user" {
            let counted = names.iter().filter(|n| *n != "activate_tools").count();
            assert!(counted <= 15, "turn {}: {counted} tools", turn_of(request));
        }
    }
}

/// The last user message of a request.
fn last_user(request: &Value) -> String {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// Whether a request is a compaction's summary call.
fn is_summary_call(request: &Value) -> bool {
    last_user(request).starts_with("Summarise")
}

/// A model that answers summary calls with `SUMMARY` (or `summary`) and everything else with
/// a short text.
fn summarising_model(summary: Reply) -> Script {
    Script::route(move |request| {
        if is_summary_call(request) {
            summary.clone()
        } else {
            Reply::text(&["noted"])
        }
    })
}

/// A small window, so a few long messages pass `compact_at`.
fn with_small_window(mock: &MockLlm) -> impl FnOnce(&mut Config) + use<> {
    let configure = with_model(mock);
    move |c: &mut Config| {
        configure(c);
        c.llm.context_window = 6000;
        c.llm.max_tokens = 500;
        c.llm.compact_at = 0.5;
        // Few tools, so the window is about the conversation.
        c.tool_policy.allow = vec!["read_file".into()];
    }
}

#[tokio::test]
async fn a_long_conversation_is_summarised_in_what_is_sent_never_in_what_is_stored() {
    let mock = MockLlm::start(summarising_model(
        Reply::text(&["SUMMARY of turns one and two"]).with_usage(900, 40),
    ))
    .await;
    let app = TestApp::spawn_with(with_small_window(&mock)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    // Each input is ~1000 tokens by the estimate; the window's half is 3000.
    let mut compacted = None;
    for turn in 1..=4 {
        let input = format!("turn {turn} {}", "word ".repeat(600));
        let (notes, end) = run_turn(&mut ws, &session, &input).await;
        assert_eq!(end["reason"], "completed", "{end}");
        if let Some(note) = notes.iter().find(|n| n["method"] == "session/compacted") {
            compacted = Some((turn, note["params"].clone()));
            break;
        }
    }
    let (turn, params) = compacted.expect("the conversation was compacted");
    assert!(turn >= 3, "compacted at turn {turn}");
    assert_eq!(params["summary_tokens"], 40);
    let replaced = params["replaced_messages"].as_u64().unwrap();
    assert!(replaced >= 2, "{params}");
    assert!(
        params["tokens_after"].as_u64() < params["tokens_before"].as_u64(),
        "{params}"
    );
    assert!(params["seq"].as_i64().is_some());

    let requests = mock.requests();
    let at = requests.iter().position(is_summary_call).unwrap();
    let summary_call = &requests[at];
    assert!(
        summary_call["tools"].is_null(),
        "the summary call offers no tools"
    );
    let transcript = last_user(summary_call);
    assert!(
        transcript.contains("[user] turn 1 word"),
        "{}",
        &transcript[..200]
    );
    // The request after it carries the summary in place of the replaced messages, and the
    // newest ones verbatim.
    let next = &requests[at + 1];
    let messages = next["messages"].as_array().unwrap();
    assert_eq!(messages[0]["role"], "system");
    let summary = messages[1]["content"].as_str().unwrap();
    assert!(
        summary.starts_with("[Summary of the earlier conversation"),
        "{summary}"
    );
    assert!(
        summary.ends_with("SUMMARY of turns one and two"),
        "{summary}"
    );
    assert!(
        !messages.iter().any(|m| m["content"]
            .as_str()
            .is_some_and(|c| c.starts_with("turn 1 "))),
        "turn 1 is no longer sent"
    );
    assert!(last_user(next).starts_with(&format!("turn {turn} ")));

    // The store still has every message.
    let stored = app
        .get_json(&format!("/api/sessions/{session}/messages"), None)
        .await;
    let users: Vec<&str> = stored["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| &m["content"].as_str().unwrap()[..7])
        .collect();
    assert_eq!(users.len(), turn);
    assert_eq!(users[0], "turn 1 ");
    // The summary call is billed as its own row.
    let cost = app
        .get_json(&format!("/api/sessions/{session}/cost"), None)
        .await;
    let nodes: Vec<&str> = cost["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["node_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        nodes.iter().filter(|n| **n == "compaction").count(),
        1,
        "{nodes:?}"
    );

    // After a restart the next turn still starts from the summary, without a new one.
    drop(ws);
    let dir = app.stop().await;
    let mut config = crate::support::config_in(dir.path());
    with_small_window(&mock)(&mut config);
    let app = TestApp::start_in(dir, config).await;
    let mut ws = app.ws().await;
    ws.call("session/open", json!({"session_id": session}))
        .await;
    let before = mock.request_count();
    let (_, end) = run_turn(&mut ws, &session, "one more").await;
    assert_eq!(end["reason"], "completed", "{end}");
    let requests = mock.requests();
    assert_eq!(requests.len(), before + 1, "no second summary");
    let first = requests[before]["messages"][1]["content"].as_str().unwrap();
    assert!(first.ends_with("SUMMARY of turns one and two"), "{first}");
}

#[tokio::test]
async fn a_failed_summary_falls_back_to_leaving_the_oldest_messages_out() {
    let mock = MockLlm::start(summarising_model(Reply::status(400))).await;
    let app = TestApp::spawn_with(with_small_window(&mock)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    for turn in 1..=6 {
        let input = format!("turn {turn} {}", "word ".repeat(600));
        let (notes, end) = run_turn(&mut ws, &session, &input).await;
        assert_eq!(end["reason"], "completed", "turn {turn}: {end}");
        assert!(!notes.iter().any(|n| n["method"] == "session/compacted"));
    }
    let requests = mock.requests();
    assert!(requests.iter().any(is_summary_call), "compaction was tried");
    let last = requests.iter().rev().find(|r| !is_summary_call(r)).unwrap();
    let system = last["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.contains("earlier messages of this conversation were left out"),
        "{system}"
    );
    let cost = app
        .get_json(&format!("/api/sessions/{session}/cost"), None)
        .await;
    assert!(
        cost["rows"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["node_id"] == "agent"),
        "a failed summary call has no row: {cost}"
    );
}

#[tokio::test]
async fn session_compact_summarises_on_request() {
    let mock = MockLlm::start(summarising_model(Reply::text(&["SHORT SUMMARY"]))).await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (_, answer) = ws
        .call("session/compact", json!({"session_id": session}))
        .await;
    assert_eq!(
        answer["error"]["data"]["kind"], "nothing_to_compact",
        "{answer}"
    );
    assert_eq!(mock.request_count(), 0, "no model call for nothing");
    for turn in 1..=3 {
        run_turn(&mut ws, &session, &format!("turn {turn}")).await;
    }
    let (before, answer) = ws
        .call("session/compact", json!({"session_id": session}))
        .await;
    let result = &answer["result"];
    assert_eq!(result["replaced_messages"], 2, "{answer}");
    let event = before
        .iter()
        .find(|n| n["method"] == "session/compacted")
        .expect("session/compacted comes before the answer");
    assert_eq!(event["params"]["replaced_messages"], 2);
    assert_eq!(event["params"]["tokens_after"], result["tokens_after"]);
    assert!(event["params"].get("turn_id").is_none());

    let (_, end) = run_turn(&mut ws, &session, "turn 4").await;
    assert_eq!(end["reason"], "completed");
    let last = mock.requests().pop().unwrap();
    let messages = last["messages"].as_array().unwrap();
    assert!(
        messages[1]["content"]
            .as_str()
            .unwrap()
            .ends_with("SHORT SUMMARY")
    );
    // Turn 1 went into the summary; turns 2 and 3 stay verbatim, then turn 4.
    let users: Vec<&str> = messages
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(users[1..], ["turn 2", "turn 3", "turn 4"]);
    let cost = app
        .get_json(&format!("/api/sessions/{session}/cost"), None)
        .await;
    let compaction = cost["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["node_id"] == "compaction")
        .expect("a compaction row");
    assert!(compaction["turn_id"].is_null());
}

/// A turn keeps the history it read: its later model requests are built from what the turn
/// itself appended, not read back from the store. A message planted in the store mid-turn is
/// therefore not in that turn's next request; the next turn reads the store again, and sees it.
#[tokio::test]
async fn a_turn_keeps_its_history_and_the_next_turn_reads_the_store_again() {
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::hold_then_tool_calls(
            release.clone(),
            vec![ScriptedCall::whole(
                "c1",
                "read_file",
                &json!({"path": "a.txt"}),
            )],
        ),
        Reply::text(&["read it"]),
        Reply::text(&["seen"]),
    ]))
    .await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    std::fs::write(app.workspace().join("a.txt"), "alpha\n").unwrap();
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (_, answer) = ws
        .call(
            "turn/start",
            json!({"session_id": session, "input": [{"kind": "text", "text": "read a.txt"}]}),
        )
        .await;
    assert!(answer.get("error").is_none(), "{answer}");
    mock.wait_for_requests(1, std::time::Duration::from_secs(10))
        .await;

    // The turn has read its history and waits on the model: a message lands in the store
    // behind its back.
    let url = format!(
        "sqlite://{}",
        app.dir.path().join("data/agentd.db").display()
    );
    let store = agentd::store::connect(&url).await.unwrap();
    let planted = json!({"role": "user", "content": "planted behind the turn"});
    let last_seq = store.get_session(&session).await.unwrap().unwrap().last_seq;
    store
        .append_message(&session, &planted, last_seq)
        .await
        .unwrap();
    release.notify_one();
    loop {
        let message = ws.next_json().await;
        if message["method"] == "turn/completed" {
            assert_eq!(message["params"]["reason"], "completed", "{message}");
            break;
        }
    }
    let mentions = |request: &Value| request.to_string().contains("planted behind the turn");
    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    assert!(!mentions(&requests[0]));
    // The second request has the tool's result, which the turn appended, and not the plant.
    assert!(requests[1].to_string().contains("alpha"), "{}", requests[1]);
    assert!(!mentions(&requests[1]), "{}", requests[1]);

    let (_, end) = run_turn(&mut ws, &session, "again").await;
    assert_eq!(end["reason"], "completed", "{end}");
    let requests = mock.requests();
    assert!(mentions(&requests[2]), "{}", requests[2]);
    store.close().await;
}
