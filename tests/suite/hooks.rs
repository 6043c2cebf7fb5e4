//! `[[hooks]]`: command hooks in the session's sandbox and URL hooks signed with HMAC, with
//! Claude Code's JSON, around every call and every turn; each run told as `hook/ran`.

use std::sync::{Arc, Mutex};

use agentd::agent::hooks::{HookConfig, HookEvent, signature};
use agentd::config::Secret;
use axum::http::HeaderMap;
use serde_json::{Value, json};

use crate::suite::agent::run_turn;
use crate::support::TestApp;
use crate::support::mock_llm::{MockLlm, Reply, Script};

fn command_hook(event: HookEvent, matcher: &str, command: &str) -> HookConfig {
    HookConfig {
        name: None,
        event,
        matcher: (!matcher.is_empty()).then(|| matcher.to_string()),
        command: Some(command.to_string()),
        url: None,
        secret_env: None,
        timeout_secs: 10,
        secret: None,
    }
}

/// A local hook receiver: records each body whose signature is right, answers with context.
async fn receiver(secret: &'static str) -> (String, Arc<Mutex<Vec<(Value, bool)>>>) {
    let seen: Arc<Mutex<Vec<(Value, bool)>>> = Arc::default();
    let record = Arc::clone(&seen);
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: String| {
            let record = Arc::clone(&record);
            async move {
                let expected = signature(&Secret::new(secret), &body);
                let signed = headers
                    .get("x-agentd-signature")
                    .and_then(|v| v.to_str().ok())
                    == Some(expected.as_str());
                record
                    .lock()
                    .unwrap()
                    .push((serde_json::from_str(&body).unwrap(), signed));
                axum::Json(json!({"hookSpecificOutput": {
                    "hookEventName": "PostToolUse",
                    "additionalContext": "THE-RECEIVER-SAYS-HI"}}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, seen)
}

#[tokio::test]
async fn hooks_block_rewrite_add_context_time_out_and_are_told() {
    let (url, seen) = receiver("s3cret").await;
    let mock = MockLlm::start(Script::always(Reply::text(&["ok"]))).await;
    let base_url = mock.base_url();
    let app = TestApp::spawn_with(move |c| {
        c.llm.base_url = Some(base_url);
        c.llm.model = Some("test-model".into());
        c.hooks = vec![
            // Exit 2 blocks, with stderr as the reason.
            command_hook(
                HookEvent::PreToolUse,
                "shell",
                "if grep -q 'rm -rf'; then echo 'no rm -rf here' >&2; exit 2; fi",
            ),
            // A JSON deny.
            command_hook(
                HookEvent::PreToolUse,
                "write_file",
                r#"echo '{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"deny","permissionDecisionReason":"read-only today"}}'"#,
            ),
            // A rewritten input.
            command_hook(
                HookEvent::PreToolUse,
                "read_file",
                r#"echo '{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"allow","updatedInput":{"path":"b.txt"}}}'"#,
            ),
            // Too slow: reported, and the call goes on.
            HookConfig {
                timeout_secs: 1,
                ..command_hook(HookEvent::PreToolUse, "glob", "sleep 20")
            },
            // A signed URL hook adding context to a result.
            HookConfig {
                url: Some(url),
                command: None,
                secret: Some(Secret::new("s3cret")),
                ..command_hook(HookEvent::PostToolUse, "list_dir", "")
            },
            // Context for the model with the prompt.
            command_hook(
                HookEvent::UserPromptSubmit,
                "",
                r#"echo '{"hookSpecificOutput":{"hookEventName":"UserPromptSubmit","additionalContext":"BRANCH-IS-MAIN"}}'"#,
            ),
        ];
    })
    .await;
    std::fs::write(app.workspace().join("a.txt"), "A-CONTENT\n").unwrap();
    std::fs::write(app.workspace().join("b.txt"), "B-CONTENT\n").unwrap();
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let invoke = |name: &str, arguments: Value| json!({"session_id": session, "name": name, "arguments": arguments});

    let blocked = ws
        .result(
            "tool/invoke",
            invoke("shell", json!({"command": "rm -rf ./x"})),
        )
        .await;
    assert_eq!(blocked["success"], false, "{blocked}");
    assert_eq!(
        blocked["structured_metadata"]["error"]["kind"], "hook_blocked",
        "{blocked}"
    );
    assert!(
        blocked["output"]
            .as_str()
            .unwrap()
            .contains("no rm -rf here")
    );
    // The same hook lets other commands through.
    let passed = ws
        .result(
            "tool/invoke",
            invoke("shell", json!({"command": "echo fine"})),
        )
        .await;
    assert_eq!(passed["success"], true, "{passed}");

    let denied = ws
        .result(
            "tool/invoke",
            invoke("write_file", json!({"path": "c.txt", "content": "x"})),
        )
        .await;
    assert_eq!(
        denied["structured_metadata"]["error"]["kind"],
        "hook_blocked"
    );
    assert!(
        denied["output"]
            .as_str()
            .unwrap()
            .contains("read-only today")
    );
    assert!(!app.workspace().join("c.txt").exists());

    let rewritten = ws
        .result("tool/invoke", invoke("read_file", json!({"path": "a.txt"})))
        .await;
    assert!(
        rewritten["output"].as_str().unwrap().contains("B-CONTENT"),
        "{rewritten}"
    );

    let slow = ws
        .result("tool/invoke", invoke("glob", json!({"pattern": "*.txt"})))
        .await;
    assert_eq!(slow["success"], true, "{slow}");

    let listed = ws
        .result("tool/invoke", invoke("list_dir", json!({})))
        .await;
    assert!(
        listed["output"]
            .as_str()
            .unwrap()
            .contains("THE-RECEIVER-SAYS-HI"),
        "{listed}"
    );
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        let (body, signed) = &seen[0];
        assert!(signed, "the signature did not match: {body}");
        assert_eq!(body["hook_event_name"], "PostToolUse");
        assert_eq!(body["tool_name"], "list_dir");
        assert_eq!(body["session_id"], session.as_str());
        assert!(body["tool_response"]["output"].is_string());
    }

    // The prompt's hook context reaches the model with the prompt.
    let (_, end) = run_turn(&mut ws, &session, "hello").await;
    assert_eq!(end["reason"], "completed", "{end}");
    let last = mock.requests()[0]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    let content = last["content"].as_str().unwrap();
    assert!(
        content.starts_with("hello") && content.contains("BRANCH-IS-MAIN"),
        "{content}"
    );

    // Every run was told, stored and replayed, with its decision.
    let events = app.replay(&session).await;
    let ran: Vec<(String, String)> = events
        .iter()
        .filter(|e| e["method"] == "hook/ran")
        .map(|e| {
            (
                e["params"]["event"].as_str().unwrap().to_string(),
                e["params"]["decision"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected = [
        ("PreToolUse", "block"),
        ("PreToolUse", "none"),
        ("PreToolUse", "block"),
        ("PreToolUse", "allow"),
        ("PreToolUse", "timeout"),
        ("PostToolUse", "none"),
        ("UserPromptSubmit", "none"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(ran, expected, "{events:?}");
    let timed_out = events
        .iter()
        .find(|e| e["method"] == "hook/ran" && e["params"]["decision"] == "timeout")
        .unwrap();
    assert!(timed_out["params"]["duration_ms"].as_u64().unwrap() >= 1000);
    assert!(timed_out["params"]["tool_call_id"].is_string());
}

#[tokio::test]
async fn a_sub_agents_calls_meet_the_same_hooks() {
    use crate::support::mock_llm::ScriptedCall;
    // The child (its conversation opens with "child task") reads a file, then answers.
    let mock = MockLlm::start(Script::route(|request: &Value| {
        let messages = request["messages"].as_array().unwrap();
        let child = messages
            .iter()
            .any(|m| m["role"] == "user" && m["content"] == "child task");
        let answered = messages.last().unwrap()["role"] == "tool";
        match (child, answered) {
            (true, false) => Reply::tool_calls(vec![ScriptedCall::whole(
                "child_call",
                "read_file",
                &json!({"path": "notes.txt"}),
            )]),
            _ => Reply::text(&["done"]),
        }
    }))
    .await;
    let base_url = mock.base_url();
    let app = TestApp::spawn_with(move |c| {
        c.llm.base_url = Some(base_url);
        c.llm.model = Some("test-model".into());
        c.hooks = vec![command_hook(
            HookEvent::PreToolUse,
            "read_file",
            "echo 'no reading for anyone' >&2; exit 2",
        )];
    })
    .await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    ws.invoke(&session, "spawn_agent", json!({"message": "child task"}))
        .await;
    mock.wait_for_requests(2, crate::support::WAIT).await;
    let second = &mock.requests()[1];
    let answer = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == "child_call")
        .expect("the child's call was answered")["content"]
        .to_string();
    assert!(answer.contains("no reading for anyone"), "{answer}");
    // The child's events, its hooks' included, go to its own transcript, as its calls do.
}

#[tokio::test]
async fn pre_compact_and_session_end_hooks_run_with_their_json() {
    let mock = MockLlm::start(Script::always(Reply::text(&["a summary of it all"]))).await;
    let base_url = mock.base_url();
    let app = TestApp::spawn_with(move |c| {
        c.llm.base_url = Some(base_url);
        c.llm.model = Some("test-model".into());
        c.hooks = vec![
            command_hook(HookEvent::PreCompact, "", "cat > precompact.json"),
            command_hook(HookEvent::SessionEnd, "", "cat > ended.json"),
        ];
    })
    .await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    for text in ["one", "two", "three"] {
        let (_, end) = run_turn(&mut ws, &session, text).await;
        assert_eq!(end["reason"], "completed", "{end}");
    }
    ws.result("session/compact", json!({"session_id": session}))
        .await;
    let read = |name: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(app.workspace().join(name)).unwrap()).unwrap()
    };
    let compact = read("precompact.json");
    assert_eq!(compact["hook_event_name"], "PreCompact");
    assert_eq!(compact["trigger"], "manual");
    assert_eq!(compact["session_id"], session.as_str());
    assert!(!app.workspace().join("ended.json").exists());
    assert_eq!(app.delete_session(&session).await, 204);
    let ended = read("ended.json");
    assert_eq!(ended["hook_event_name"], "SessionEnd");
    assert_eq!(ended["reason"], "closed");
}

/// A `PreToolUse` hook on `tool` that blocks arguments saying "forbidden" (exit 2 with
/// `reason`), and a `PostToolUse` hook on `post_matcher` that adds `context`.
fn guard_hooks(tool: &str, post_matcher: &str, reason: &str, context: &str) -> Vec<HookConfig> {
    vec![
        command_hook(
            HookEvent::PreToolUse,
            tool,
            &format!("grep -q forbidden && {{ echo '{reason}' >&2; exit 2; }}; exit 0"),
        ),
        command_hook(
            HookEvent::PostToolUse,
            post_matcher,
            &format!(
                r#"echo '{{"hookSpecificOutput": {{"hookEventName": "PostToolUse", "additionalContext": "{context}"}}}}'"#
            ),
        ),
    ]
}

/// Calls `tool` with `blocked` arguments (refused `hook_blocked` with `reason`, told as one
/// `hook/ran`), then with `allowed` ones; answers the allowed call's output, which must carry
/// `context`.
async fn guarded_call(
    ws: &mut crate::support::WsClient,
    session: &str,
    tool: &str,
    (blocked, allowed): (Value, Value),
    (reason, context): (&str, &str),
) -> String {
    let (notes, refused) = ws
        .call(
            "tool/invoke",
            json!({"session_id": session, "name": tool, "arguments": blocked}),
        )
        .await;
    let refused = &refused["result"];
    assert_eq!(refused["success"], false, "{refused}");
    assert_eq!(
        refused["structured_metadata"]["error"]["kind"],
        "hook_blocked"
    );
    assert!(
        refused["output"].as_str().unwrap().contains(reason),
        "{refused}"
    );
    let ran: Vec<&Value> = notes.iter().filter(|n| n["method"] == "hook/ran").collect();
    assert_eq!(ran.len(), 1, "{notes:?}");
    assert_eq!(ran[0]["params"]["event"], "PreToolUse");
    let answer = ws.invoke(session, tool, allowed).await;
    let output = answer["output"].as_str().unwrap().to_string();
    assert!(output.contains(context), "{answer}");
    output
}

#[tokio::test]
async fn an_mcp_servers_tools_meet_the_same_hooks() {
    let Some(script) = crate::suite::mcp::everything_script() else {
        return;
    };
    let with_everything = crate::suite::mcp::with_everything(script);
    let app = TestApp::spawn_with(move |c| {
        with_everything(c);
        c.hooks = guard_hooks(
            "mcp__everything__echo",
            "mcp__everything__*",
            "no forbidden echoes",
            "checked by the MCP hook",
        );
    })
    .await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    // Allowed through, the call runs on the MCP server and carries the hook's context.
    let output = guarded_call(
        &mut ws,
        &session,
        "mcp__everything__echo",
        (
            json!({"message": "something forbidden"}),
            json!({"message": "harmless"}),
        ),
        ("no forbidden echoes", "checked by the MCP hook"),
    )
    .await;
    assert!(output.starts_with("Echo: harmless"), "{output}");
}

#[tokio::test]
async fn a_plugins_calls_meet_the_same_hooks() {
    let scratch = tempfile::tempdir().unwrap();
    let script = scratch.path().join("stamp.sh");
    std::fs::write(&script, "#!/bin/sh\ncat >/dev/null\necho stamped\n").unwrap();
    let mut perms = std::fs::metadata(&script).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&script, perms).unwrap();
    let plugin = agentd::config::PluginConfig {
        name: "stamp".into(),
        description: "Stamps a document.".into(),
        command: script.to_string_lossy().into_owned(),
        args: Vec::new(),
        spawn_only: false,
        tags: Vec::new(),
        exclusive: false,
        timeout_ms: 30_000,
        input_schema: json!({"type": "object"}),
    };
    let app = TestApp::spawn_with(move |c| {
        c.plugins.push(plugin);
        c.hooks = guard_hooks(
            "stamp",
            "stamp",
            "no stamping that",
            "checked by the plugin hook",
        );
    })
    .await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let output = guarded_call(
        &mut ws,
        &session,
        "stamp",
        (json!({"doc": "forbidden"}), json!({"doc": "the memo"})),
        ("no stamping that", "checked by the plugin hook"),
    )
    .await;
    assert!(output.starts_with("stamped"), "{output}");
}

#[tokio::test]
async fn a_url_hooks_path_and_query_are_never_stored_or_exported() {
    // A receiver whose URL carries its secret in the path and the query, as webhook URLs do.
    let app_hook = axum::Router::new().route(
        "/hook/SECRET-IN-PATH",
        axum::routing::post(|| async { axum::Json(json!({})) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app_hook).await.unwrap() });
    // A port nothing listens on: the failure's reason must not carry the URL either.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let url_hook = |url: String, name: Option<&str>| HookConfig {
        name: name.map(str::to_string),
        url: Some(url),
        command: None,
        timeout_secs: 5,
        ..command_hook(HookEvent::PostToolUse, "list_dir", "")
    };
    let app = TestApp::spawn_with(move |c| {
        c.hooks = vec![
            url_hook(
                format!("http://127.0.0.1:{port}/hook/SECRET-IN-PATH?token=SECRET-IN-QUERY"),
                None,
            ),
            url_hook(
                format!("http://127.0.0.1:{closed_port}/down/SECRET-IN-PATH?token=SECRET-IN-QUERY"),
                None,
            ),
            url_hook(
                format!("http://127.0.0.1:{port}/hook/SECRET-IN-PATH?token=SECRET-IN-QUERY"),
                Some("audit"),
            ),
        ];
    })
    .await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let listed = ws.invoke(&session, "list_dir", json!({})).await;
    assert_eq!(listed["success"], true, "{listed}");

    let events = app.replay(&session).await;
    let ran: Vec<(String, String)> = events
        .iter()
        .filter(|e| e["method"] == "hook/ran")
        .map(|e| {
            (
                e["params"]["hook"].as_str().unwrap().to_string(),
                e["params"]["decision"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected = [
        ("127.0.0.1", "none"),
        ("127.0.0.1", "error"),
        ("audit", "none"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(ran, expected, "{events:?}");
    let (status, export) = app
        .get(&format!("/api/sessions/{session}/export"), None)
        .await;
    assert_eq!(status, 200, "{export}");
    assert!(export.contains("hook/ran"), "{export}");
    for text in [serde_json::to_string(&events).unwrap(), export] {
        assert!(!text.contains("SECRET-IN"), "{text}");
        assert!(!text.contains("/hook"), "{text}");
    }
}

/// A hook that answers `allow` to everything, for a model that tries to use it as a key.
const ALLOW_EVERYTHING: &str =
    r#"echo '{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"allow"}}'"#;

/// Waits for `approval/requested` of the call `tool_call_id` and declines it; fails the test
/// when the call ends (or the turn does) without asking.
async fn declined_after_asking(
    ws: &mut crate::support::WsClient,
    session: &str,
    tool_call_id: &str,
) {
    loop {
        let message = ws.next_json().await;
        let params = &message["params"];
        match message["method"].as_str().unwrap_or_default() {
            "approval/requested" => {
                assert_eq!(params["tool_call_id"], tool_call_id, "{message}");
                ws.result(
                    "approval/respond",
                    json!({"session_id": session, "approval_id": params["approval_id"], "decision": "decline"}),
                )
                .await;
                return;
            }
            "tool/completed" if params["tool_call_id"] == tool_call_id => {
                panic!("{tool_call_id} ended without asking: {message}")
            }
            "turn/completed" | "turn/error" => {
                panic!("the turn ended before {tool_call_id} asked: {message}")
            }
            _ => {}
        }
    }
}

/// A `PreToolUse` hook that answers `allow` to every call lets no call past a deny rule
/// (named, or hidden where the words cannot show it) nor past the `.git` rule.
#[tokio::test]
async fn a_hooks_allow_passes_neither_a_deny_rule_nor_the_git_rule() {
    use crate::support::mock_llm::ScriptedCall;
    use agentd::tools::approval::{CommandRule, RuleAction};
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::tool_calls(vec![ScriptedCall::whole(
            "named",
            "shell",
            &json!({"command": "rm victim"}),
        )]),
        Reply::tool_calls(vec![ScriptedCall::whole(
            "hidden",
            "shell",
            &json!({"command": "r=rm; $r victim"}),
        )]),
        Reply::tool_calls(vec![ScriptedCall::whole(
            "git_config",
            "write_file",
            &json!({"path": ".git/config", "content": "[core]\n\tfsmonitor = rm victim\n"}),
        )]),
        Reply::text(&["done"]),
    ]))
    .await;
    let app = TestApp::spawn_with({
        let with_model = crate::suite::agent::with_model(&mock);
        move |c| {
            with_model(c);
            c.tool_policy.commands = vec![CommandRule {
                prefix: vec!["rm".into()],
                action: RuleAction::Deny,
            }];
            c.hooks = vec![command_hook(HookEvent::PreToolUse, "", ALLOW_EVERYTHING)];
        }
    })
    .await;
    let root = app.workspace();
    std::fs::write(root.join("victim"), "keep\n").unwrap();
    std::fs::create_dir(root.join(".git")).unwrap();
    std::fs::write(root.join(".git/config"), "[core]\n").unwrap();
    let mut ws = app.ws().await;
    let session = ws.open().await;
    ws.result(
        "turn/start",
        json!({"session_id": session, "input": [{"kind": "text", "text": "clean up"}]}),
    )
    .await;
    let refused = loop {
        let note = ws.notification("tool/completed").await;
        if note["tool_call_id"] == "named" {
            break note;
        }
    };
    assert_eq!(
        refused["structured_metadata"]["error"]["kind"], "policy_denied",
        "{refused}"
    );
    declined_after_asking(&mut ws, &session, "hidden").await;
    declined_after_asking(&mut ws, &session, "git_config").await;
    let end = ws.notification("turn/completed").await;
    assert_eq!(end["reason"], "completed", "{end}");
    assert_eq!(
        std::fs::read_to_string(root.join("victim")).unwrap(),
        "keep\n"
    );
    assert_eq!(
        std::fs::read_to_string(root.join(".git/config")).unwrap(),
        "[core]\n"
    );
    // The hook did run and said allow each time: it was heard, and outranked.
    let events = app.replay(&session).await;
    let allows = events
        .iter()
        .filter(|e| e["method"] == "hook/ran" && e["params"]["decision"] == "allow")
        .count();
    assert_eq!(allows, 3, "{events:?}");
}

/// `turn/interrupt` stops a `PreToolUse` hook that would sleep for 30 s: the hook's process is
/// killed, the call does not run, and the turn ends `interrupted` at once.
#[tokio::test]
async fn an_interrupt_stops_a_running_hook_at_once() {
    use crate::support::mock_llm::ScriptedCall;
    let mock = MockLlm::start(Script::sequence(vec![Reply::tool_calls(vec![
        ScriptedCall::whole(
            "slow",
            "write_file",
            &json!({"path": "written", "content": "x"}),
        ),
    ])]))
    .await;
    let app = TestApp::spawn_with({
        let with_model = crate::suite::agent::with_model(&mock);
        move |c| {
            with_model(c);
            c.hooks = vec![HookConfig {
                timeout_secs: 60,
                ..command_hook(HookEvent::PreToolUse, "write_file", "sleep 30")
            }];
        }
    })
    .await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let started = ws
        .result(
            "turn/start",
            json!({"session_id": session, "input": [{"kind": "text", "text": "write"}]}),
        )
        .await;
    ws.notification("tool/started").await;
    let (notes, answer) = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        ws.call("turn/interrupt", json!({"session_id": session})),
    )
    .await
    .expect("the interrupt is answered long before the hook's sleep ends");
    assert_eq!(answer["result"]["interrupted"], true, "{answer}");
    let of = |method: &str| -> Vec<&Value> {
        notes
            .iter()
            .filter(|n| n["method"] == method)
            .map(|n| &n["params"])
            .collect()
    };
    let ended = of("turn/error");
    assert_eq!(ended.len(), 1, "{notes:?}");
    assert_eq!(ended[0]["turn_id"], started["turn_id"]);
    assert_eq!(ended[0]["code"], "interrupted");
    let completed = of("tool/completed");
    assert_eq!(
        completed[0]["structured_metadata"]["error"]["kind"], "interrupted",
        "{notes:?}"
    );
    assert!(!app.workspace().join("written").exists());
}
