//! Turns end to end: the real server and provider against the scripted model, asserting on what
//! the model was sent as well as on what the client saw.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use agentd::config::{Config, ModelCard, ModelPrice};
use agentd::tools::{Effects, Tool, ToolContext, ToolError, ToolMeta, ToolResult};
use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::sync::Barrier;

use crate::support::mock_llm::{MockLlm, Reply, Script, ScriptedCall};
use crate::support::{TestApp, WAIT, WsClient};

pub(crate) const MODEL: &str = "test-model";

pub(crate) fn with_model(mock: &MockLlm) -> impl FnOnce(&mut Config) + use<> {
    let url = mock.base_url();
    move |c: &mut Config| {
        c.llm.base_url = Some(url);
        c.llm.model = Some(MODEL.into());
        c.llm
            .pricing
            .insert(MODEL.into(), ModelCard::priced(ModelPrice::new(1.0, 2.0)));
    }
}

/// The scripted model (and the models in `also`) priced so that one call, capped at 100
/// completion tokens at 10,000 USD per million, reserves just over 1 USD, under a 1.5 USD cap:
/// room for one call, not two.
pub(crate) fn with_tight_budget(mock: &MockLlm, also: &[&str]) -> impl FnOnce(&mut Config) + use<> {
    let configure = with_model(mock);
    let models: Vec<String> = std::iter::once(MODEL)
        .chain(also.iter().copied())
        .map(str::to_string)
        .collect();
    move |c: &mut Config| {
        configure(c);
        c.llm.max_tokens = 100;
        for model in models {
            c.llm
                .pricing
                .insert(model, ModelCard::priced(ModelPrice::new(1.0, 10_000.0)));
        }
        c.budget.session_usd = Some(1.5);
    }
}

/// Starts a turn and collects every notification until it ends; returns them and the end.
pub(crate) async fn run_turn(ws: &mut WsClient, session: &str, text: &str) -> (Vec<Value>, Value) {
    let (before, answer) = ws
        .call(
            "turn/start",
            json!({"session_id": session, "input": [{"kind": "text", "text": text}]}),
        )
        .await;
    assert!(answer.get("error").is_none(), "turn/start failed: {answer}");
    assert_eq!(
        before.last().unwrap()["method"],
        "turn/started",
        "turn/started comes first"
    );
    let mut notes = before;
    loop {
        let message = ws.next_json().await;
        let method = message["method"].as_str().unwrap_or_default().to_string();
        notes.push(message.clone());
        if method == "turn/completed" || method == "turn/error" {
            return (notes, message["params"].clone());
        }
    }
}

pub(crate) fn of<'a>(notes: &'a [Value], method: &str) -> Vec<&'a Value> {
    notes
        .iter()
        .filter(|n| n["method"] == method)
        .map(|n| &n["params"])
        .collect()
}

pub(crate) fn tool_names(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_text_turn_streams_in_pieces_and_is_billed() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::text(&["Hel", "lo", " there"]).with_usage(1000, 500),
    ]))
    .await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (notes, end) = run_turn(&mut ws, &session, "hi").await;

    let deltas: Vec<&str> = of(&notes, "message/delta")
        .iter()
        .map(|d| d["text"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, ["Hel", "lo", " there"]);
    assert_eq!(of(&notes, "message/completed")[0]["text"], "Hello there");
    assert_eq!(end["tokens_in"], 1000);
    assert_eq!(end["tokens_out"], 500);
    let expected = 1000.0 * 1.0 / 1e6 + 500.0 * 2.0 / 1e6;
    assert!(
        (end["cost_usd"].as_f64().unwrap() - expected).abs() < 1e-12,
        "{end}"
    );
    assert_eq!(end["cost_usd"], end["session_cost_usd"]);

    let request = &mock.requests()[0];
    assert_eq!(request["model"], MODEL);
    assert_eq!(request["stream"], true);
    let roles: Vec<&str> = request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user"]);
    assert_eq!(request["messages"][1]["content"], "hi");
    assert!(tool_names(request).contains(&"read_file".to_string()));

    let cost = app
        .get_json(&format!("/api/sessions/{session}/cost"), None)
        .await;
    assert_eq!(cost["rows"][0]["node_id"], "agent");
    assert_eq!(cost["rows"][0]["committed"], true);
    assert_eq!(cost["rows"][0]["tokens_in"], 1000);
    let messages = app
        .get_json(&format!("/api/sessions/{session}/messages"), None)
        .await;
    assert_eq!(
        messages["messages"],
        json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello there"}])
    );
}

#[tokio::test]
async fn a_tool_call_then_an_answer_keeps_the_call_ids_matched() {
    let args = json!({"path": "notes.txt", "content": "from the model\n"});
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::tool_calls(vec![ScriptedCall::whole("call_w1", "write_file", &args)]),
        Reply::text(&["done"]),
        Reply::text(&["again"]),
    ]))
    .await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (notes, end) = run_turn(&mut ws, &session, "write a note").await;
    assert!(end.get("code").is_none(), "{end}");

    let started = of(&notes, "tool/started");
    assert_eq!(started[0]["tool_call_id"], "call_w1");
    assert!(started[0]["turn_id"].is_string());
    let completed = of(&notes, "tool/completed");
    assert_eq!(completed[0]["success"], true);
    assert_eq!(
        std::fs::read_to_string(app.workspace().join("notes.txt")).unwrap(),
        "from the model\n"
    );

    let second = &mock.requests()[1];
    let messages = second["messages"].as_array().unwrap();
    let assistant = &messages[messages.len() - 2];
    assert_eq!(assistant["role"], "assistant");
    assert_eq!(assistant["tool_calls"][0]["id"], "call_w1");
    assert_eq!(assistant["tool_calls"][0]["function"]["name"], "write_file");
    let tool = &messages[messages.len() - 1];
    assert_eq!(tool["role"], "tool");
    assert_eq!(tool["tool_call_id"], "call_w1");
    assert!(tool["content"].as_str().unwrap().contains("notes.txt"));

    // The stored history feeds the next turn, on a new connection.
    let mut other = app.ws().await;
    other
        .result("session/open", json!({"session_id": session}))
        .await;
    let (_, end) = run_turn(&mut other, &session, "and again").await;
    assert!(end.get("code").is_none(), "{end}");
    let third = &mock.requests()[2];
    let history = third["messages"].as_array().unwrap();
    assert_eq!(
        history.len(),
        messages.len() + 2,
        "+ the answer and the new question"
    );
    assert_eq!(history[history.len() - 2]["content"], "done");
    assert_eq!(history[history.len() - 1]["content"], "and again");
}

/// A Safe tool that only finishes once its twin has started too.
struct BarrierTool {
    meta: ToolMeta,
    barrier: Arc<Barrier>,
}

impl BarrierTool {
    fn new(name: &str, barrier: Arc<Barrier>) -> Self {
        let meta = ToolMeta::new(
            name,
            "Waits for its twin.",
            json!({"type": "object"}),
            Effects::NONE,
        );
        Self { meta, barrier }
    }
}

#[async_trait]
impl Tool for BarrierTool {
    fn meta(&self) -> &ToolMeta {
        &self.meta
    }
    async fn call(&self, _ctx: &ToolContext, _args: &Value) -> Result<ToolResult, ToolError> {
        match tokio::time::timeout(WAIT, self.barrier.wait()).await {
            Ok(_) => Ok(ToolResult::ok(format!("{} met its twin", self.meta.name))),
            Err(_) => Ok(ToolResult::failure("the twin never ran at the same time")),
        }
    }
}

/// An Exclusive tool that fails on request.
struct Step;

#[async_trait]
impl Tool for Step {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "step",
                "Succeeds unless told to fail.",
                json!({"type": "object", "properties": {"fail": {"type": "boolean"}, "n": {"type": "integer"}}}),
Effects::NONE,
            )
            .exclusive()
        });
        &META
    }
    async fn call(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        if args["fail"] == true {
            return Err(ToolError::model("invalid_input", "told to fail"));
        }
        Ok(ToolResult::ok(format!("step {}", args["n"])))
    }
}

#[tokio::test]
async fn safe_calls_run_together_and_an_exclusive_batch_stops_at_the_first_failure() {
    let barrier = Arc::new(Barrier::new(2));
    let tools: Vec<Arc<dyn Tool>> = vec![
        Arc::new(BarrierTool::new("twin_a", Arc::clone(&barrier))),
        Arc::new(BarrierTool::new("twin_b", barrier)),
        Arc::new(Step),
    ];
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::tool_calls(vec![
            ScriptedCall::whole("a", "twin_a", &json!({})),
            ScriptedCall::whole("b", "twin_b", &json!({})),
        ]),
        Reply::tool_calls(vec![
            ScriptedCall::whole("s1", "step", &json!({"n": 1})),
            ScriptedCall::whole("s2", "step", &json!({"fail": true})),
            ScriptedCall::whole("s3", "step", &json!({"n": 3})),
        ]),
        Reply::text(&["ok"]),
    ]))
    .await;
    let app = TestApp::spawn_with_tools(with_model(&mock), tools).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (notes, end) = run_turn(&mut ws, &session, "go").await;
    assert!(end.get("code").is_none(), "{end}");

    let requests = mock.requests();
    let tool_messages = |request: &Value| -> Vec<(String, String)> {
        request["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| {
                (
                    m["tool_call_id"].as_str().unwrap().to_string(),
                    m["content"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let first = tool_messages(&requests[1]);
    assert_eq!(first[0], ("a".into(), "twin_a met its twin".into()));
    assert_eq!(first[1], ("b".into(), "twin_b met its twin".into()));

    let second = tool_messages(&requests[2]);
    assert_eq!(
        second.len(),
        5,
        "every call id gets exactly one tool message"
    );
    assert_eq!(second[2], ("s1".into(), "step 1".into()));
    assert_eq!(second[3].0, "s2");
    assert!(second[3].1.contains("told to fail"));
    assert_eq!(second[4].0, "s3");
    assert!(second[4].1.starts_with("cancelled"), "{}", second[4].1);
    let ran: Vec<&str> = of(&notes, "tool/started")
        .iter()
        .map(|s| s["tool_call_id"].as_str().unwrap())
        .collect();
    assert_eq!(ran, ["a", "b", "s1", "s2"], "the cancelled call never ran");
}

/// A tool that does nothing, to crowd the registry.
struct Filler(ToolMeta);

impl Filler {
    fn new(name: String) -> Self {
        Self(ToolMeta::new(
            name,
            "Fills the tool list.",
            json!({"type": "object"}),
            Effects::NONE,
        ))
    }
}

#[async_trait]
impl Tool for Filler {
    fn meta(&self) -> &ToolMeta {
        &self.0
    }
    async fn call(&self, _ctx: &ToolContext, _args: &Value) -> Result<ToolResult, ToolError> {
        Ok(ToolResult::ok(format!("{} ran", self.0.name)))
    }
}

#[tokio::test]
async fn idle_tools_are_evicted_and_come_back_when_called() {
    let tools: Vec<Arc<dyn Tool>> = (0..12)
        .map(|i| Arc::new(Filler::new(format!("filler_{i:02}"))) as Arc<dyn Tool>)
        .collect();
    let list_dir = || ScriptedCall::whole("l", "list_dir", &json!({}));
    let mut replies: Vec<Reply> = (0..5)
        .map(|_| Reply::tool_calls(vec![list_dir()]))
        .collect();
    replies.push(Reply::tool_calls(vec![ScriptedCall::whole(
        "f",
        "filler_03",
        &json!({}),
    )]));
    replies.push(Reply::text(&["done"]));
    let mock = MockLlm::start(Script::sequence(replies)).await;
    let app = TestApp::spawn_with_tools(with_model(&mock), tools).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (notes, end) = run_turn(&mut ws, &session, "crowded").await;
    assert!(end.get("code").is_none(), "{end}");

    let requests = mock.requests();
    // Tools never used in the session go at once: the first request already has 15 plus
    // activate_tools, and the list stays the same until the model brings a tool back.
    let first = tool_names(&requests[0]);
    assert_eq!(first.len(), 16, "{first:?}");
    assert!(first.contains(&"activate_tools".to_string()));
    assert!(!first.contains(&"filler_03".to_string()));
    assert_eq!(requests[4]["tools"], requests[0]["tools"]);
    let changed = of(&notes, "tools/changed");
    let evicted: Vec<&Value> = changed
        .iter()
        .flat_map(|c| c["evicted"].as_array().unwrap())
        .collect();
    assert!(evicted.contains(&&json!("filler_03")), "{changed:?}");
    // The model calls the evicted tool anyway: it runs and is visible again.
    let completed = of(&notes, "tool/completed");
    let filler = completed.iter().find(|c| c["tool_call_id"] == "f").unwrap();
    assert_eq!(filler["success"], true);
    let last = tool_names(&requests[6]);
    assert!(last.contains(&"filler_03".to_string()), "{last:?}");
    assert_eq!(last.len(), 16, "room was made in the same change: {last:?}");
    let kept: Vec<&String> = first.iter().filter(|name| last.contains(name)).collect();
    let still: Vec<&String> = last.iter().filter(|name| first.contains(name)).collect();
    assert_eq!(kept, still, "the tools that stayed kept their order");
}

#[tokio::test]
async fn the_provider_policy_hides_a_tool_and_refuses_it_when_called() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::tool_calls(vec![ScriptedCall::whole(
            "sh",
            "shell",
            &json!({"command": "echo hi"}),
        )]),
        Reply::text(&["fine"]),
    ]))
    .await;
    let configure = with_model(&mock);
    let app = TestApp::spawn_with(|c| {
        configure(c);
        c.tool_policy_by_provider.insert(
            MODEL.into(),
            agentd::tools::ToolPolicy {
                deny: vec!["shell".into()],
                ..Default::default()
            },
        );
    })
    .await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (notes, _) = run_turn(&mut ws, &session, "run something").await;
    let requests = mock.requests();
    assert!(!tool_names(&requests[0]).contains(&"shell".to_string()));
    let tool = requests[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap()
        .clone();
    assert!(
        tool["content"]
            .as_str()
            .unwrap()
            .contains("provider_policy"),
        "{tool}"
    );
    assert!(
        of(&notes, "tool/started").is_empty(),
        "the refused call never started"
    );
}

#[tokio::test]
async fn a_failing_model_is_retried_and_a_cut_stream_ends_the_turn() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::status(500),
        Reply::text(&["recovered"]),
        Reply::cut(&["half an ans"]),
    ]))
    .await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (notes, end) = run_turn(&mut ws, &session, "one").await;
    assert!(end.get("code").is_none(), "{end}");
    assert_eq!(of(&notes, "message/completed")[0]["text"], "recovered");
    assert_eq!(mock.request_count(), 2, "the 500 was retried once");

    let (_, end) = run_turn(&mut ws, &session, "two").await;
    assert_eq!(end["code"], "llm_bad_response", "{end}");
}

#[tokio::test]
async fn malformed_argument_json_goes_back_to_the_model() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::tool_calls(vec![ScriptedCall::new(
            "bad",
            "read_file",
            &["{\"path\": "],
        )]),
        Reply::text(&["sorry"]),
    ]))
    .await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (_, end) = run_turn(&mut ws, &session, "read").await;
    assert!(end.get("code").is_none(), "{end}");
    let tool = mock.requests()[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap()
        .clone();
    assert_eq!(tool["tool_call_id"], "bad");
    assert!(
        tool["content"].as_str().unwrap().contains("not valid JSON"),
        "{tool}"
    );
    let assistant = mock.requests()[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "assistant")
        .unwrap()
        .clone();
    assert_eq!(assistant["tool_calls"][0]["function"]["arguments"], "{}");
}

#[tokio::test]
async fn an_interrupt_stops_the_stream_at_once() {
    let release = Arc::new(tokio::sync::Notify::new());
    let mock = MockLlm::start(Script::sequence(vec![Reply::hold(
        &["thinking"],
        Arc::clone(&release),
        &["never sent"],
    )]))
    .await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (_, answer) = ws
        .call(
            "turn/start",
            json!({"session_id": session, "input": [{"kind": "text", "text": "slow"}]}),
        )
        .await;
    assert!(answer["result"]["turn_id"].is_string());
    let delta = ws.notification("message/delta").await;
    assert_eq!(delta["text"], "thinking");
    let (_, busy) = ws
        .call(
            "turn/start",
            json!({"session_id": session, "input": [{"kind": "text", "text": "again"}]}),
        )
        .await;
    assert_eq!(busy["error"]["data"]["kind"], "turn_in_progress");
    // The answer comes once the turn has ended, after the turn/error it caused.
    let (notes, interrupted) = tokio::time::timeout(
        Duration::from_secs(10),
        ws.call("turn/interrupt", json!({"session_id": session})),
    )
    .await
    .expect("the turn ends promptly");
    assert_eq!(interrupted["result"], json!({"interrupted": true}));
    let error = notes.iter().find(|n| n["method"] == "turn/error").unwrap();
    assert_eq!(error["params"]["code"], "interrupted");
    release.notify_one();
}

#[tokio::test]
async fn a_budget_stops_the_call_that_would_pass_it() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::tool_calls(vec![ScriptedCall::whole("l", "list_dir", &json!({}))])
            .with_usage(100, 100),
        Reply::text(&["unreachable"]),
    ]))
    .await;
    let app = TestApp::spawn_with(with_tight_budget(&mock, &[])).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (_, end) = run_turn(&mut ws, &session, "spend").await;
    assert_eq!(end["code"], "budget_exceeded", "{end}");
    assert_eq!(mock.request_count(), 1, "the second call was never made");
    let cost = app
        .get_json(&format!("/api/sessions/{session}/cost"), None)
        .await;
    let rows = cost["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["committed"], true);
    assert_eq!(rows[1]["committed"], false);
    assert!(rows[1]["reserved_usd"].as_f64().unwrap() > 1.0);
    assert_eq!(rows[1]["actual_usd"], 0.0);
}

#[tokio::test]
async fn without_a_model_turns_are_refused_but_tools_work() {
    let app = TestApp::spawn().await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (_, answer) = ws
        .call(
            "turn/start",
            json!({"session_id": session, "input": [{"kind": "text", "text": "hi"}]}),
        )
        .await;
    assert_eq!(answer["error"]["data"]["kind"], "llm_not_configured");
}

#[tokio::test]
async fn two_sessions_tick_their_own_lru_while_sharing_the_server_tools() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::tool_calls(vec![ScriptedCall::whole(
            "u1",
            "update_plan",
            &json!({"plan": []}),
        )]),
        Reply::tool_calls(vec![ScriptedCall::whole(
            "g1",
            "glob",
            &json!({"pattern": "*"}),
        )]),
        Reply::text(&["done"]),
    ]))
    .await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    let mut ws = app.ws().await;
    let busy = ws.open().await;
    let idle = ws.open().await;
    let (_, end) = run_turn(&mut ws, &busy, "work").await;
    assert!(end.get("code").is_none(), "{end}");
    let busy_lru = ws.result("tool/list", json!({"session_id": busy})).await["lru"].clone();
    let idle_lru = ws.result("tool/list", json!({"session_id": idle})).await["lru"].clone();
    assert_eq!(busy_lru["iteration"], 3, "one tick per model call");
    assert_eq!(busy_lru["last_used"]["update_plan"], 1);
    assert_eq!(busy_lru["last_used"]["glob"], 2);
    assert_eq!(
        idle_lru["iteration"], 0,
        "the other session's counters did not move"
    );
    assert_eq!(idle_lru["last_used"]["update_plan"], Value::Null);
}

#[tokio::test]
async fn a_long_conversation_is_trimmed_to_the_context_window_not_lost() {
    let mock = MockLlm::start(Script::always(Reply::text(&["noted"]))).await;
    let configure = with_model(&mock);
    let app = TestApp::spawn_with(|c| {
        configure(c);
        c.llm.max_tokens = 100;
        c.llm.context_window = 1500;
    })
    .await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let long = "x".repeat(3000);
    run_turn(&mut ws, &session, &long).await;
    run_turn(&mut ws, &session, "and now?").await;

    let requests = mock.requests();
    let sent: Vec<&str> = requests[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert!(
        sent[0].contains("2 earlier messages of this conversation were left out"),
        "{}",
        sent[0]
    );
    assert_eq!(&sent[1..], ["and now?"]);
    // The stored conversation keeps everything.
    let messages = app
        .get_json(&format!("/api/sessions/{session}/messages"), None)
        .await;
    assert_eq!(messages["messages"][0]["content"], long.as_str());
    assert_eq!(messages["messages"].as_array().unwrap().len(), 4);
}

/// A server in thinking mode, as DeepSeek's is: it streams `reasoning_content` before a tool
/// call, and refuses (HTTP 400, its own words) a request whose tool-call turn does not carry
/// that reasoning back.
fn thinking_model() -> Script {
    Script::route(|request| {
        let messages = request["messages"].as_array().cloned().unwrap_or_default();
        let calls: Vec<&Value> = messages
            .iter()
            .filter(|m| m["role"] == "assistant" && m.get("tool_calls").is_some())
            .collect();
        if calls.iter().any(|m| m.get("reasoning_content").is_none()) {
            return Reply::error(
                400,
                json!({"error": {"message": "The reasoning_content in the thinking mode must be passed back to the API.", "type": "invalid_request_error"}}),
            );
        }
        if calls.is_empty() {
            return Reply::raw_sse(concat!(
                "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"The user wants \"}}]}\n\n",
                "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"the listing.\"}}]}\n\n",
                "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_think\",\"type\":\"function\",\"function\":{\"name\":\"list_dir\",\"arguments\":\"{\\\"path\\\":\\\".\\\"}\"}}]}}]}\n\n",
                "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":5,\"total_tokens\":15}}\n\n",
                "data: [DONE]\n\n",
            ));
        }
        Reply::text(&["Listed."])
    })
}

#[tokio::test]
async fn reasoning_goes_back_with_its_tool_call_turn_so_a_thinking_model_goes_on() {
    let mock = MockLlm::start(thinking_model()).await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (notes, end) = run_turn(&mut ws, &session, "What is here?").await;
    assert_eq!(end["reason"], "completed", "{end}");
    // People see the reasoning as it streams, apart from the answer.
    let reasoned: String = of(&notes, "reasoning/delta")
        .iter()
        .map(|n| n["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(reasoned, "The user wants the listing.");
    assert!(
        of(&notes, "message/delta")
            .iter()
            .all(|n| !n["text"].as_str().unwrap().contains("listing")),
        "reasoning leaked into the answer"
    );
    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    let assistant = requests[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "assistant")
        .cloned()
        .unwrap();
    assert_eq!(
        assistant["reasoning_content"], "The user wants the listing.",
        "{assistant}"
    );
    assert_eq!(assistant["tool_calls"][0]["id"], "call_think");
    // Kept in the history, so a later turn (or a restart) sends it back too.
    let (_, end) = run_turn(&mut ws, &session, "And again?").await;
    assert_eq!(end["reason"], "completed", "{end}");
    let third = &mock.requests()[2];
    let kept = third["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "assistant" && m.get("tool_calls").is_some())
        .cloned()
        .unwrap();
    assert_eq!(kept["reasoning_content"], "The user wants the listing.");
    // A model that never reasons is never sent the field.
    let plain = &requests[0]["messages"];
    assert!(!plain.to_string().contains("reasoning_content"), "{plain}");
}
