//! Agent profiles end to end: `[[agents]]` picked by `session/open {agent}` (kept across a
//! restart) and by `spawn_agent {agent_type}`; each gets the profile's instructions, model and
//! tool limits, as the requests the scripted model receives show.

use serde_json::{Value, json};

use super::agent::{run_turn, tool_names, with_model};
use crate::support::TestApp;
use crate::support::mock_llm::{MockLlm, Reply, Script, ScriptedCall};
use agentd::config::Config;
use agentd::session::profiles::AgentProfile;
use agentd::tools::ToolPolicy;

const REVIEWER_SAYS: &str = "You review changes; you never edit files.";

fn reviewer() -> AgentProfile {
    AgentProfile {
        name: "reviewer".into(),
        description: "Reads and comments; cannot write".into(),
        instructions: Some(REVIEWER_SAYS.into()),
        model: Some("review-model".into()),
        tool_policy: Some(ToolPolicy {
            deny: vec![
                "write_file".into(),
                "apply_patch".into(),
                "edit_file".into(),
            ],
            ..ToolPolicy::default()
        }),
    }
}

fn with_reviewer(mock: &MockLlm) -> impl FnOnce(&mut Config) + use<> {
    let configure = with_model(mock);
    move |c: &mut Config| {
        configure(c);
        c.agents.push(reviewer());
    }
}

fn system_of(request: &Value) -> String {
    request["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn opener(request: &Value) -> String {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn a_session_opened_as_a_profile_keeps_its_instructions_model_and_limits() {
    let mock = MockLlm::start(Script::always(Reply::text(&["looks fine"]))).await;
    let app = TestApp::spawn_with(with_reviewer(&mock)).await;
    let mut ws = app.ws().await;

    let listed = ws.result("agent/list", json!({})).await;
    assert_eq!(
        listed,
        json!({"agents": [{"name": "reviewer", "description": "Reads and comments; cannot write", "model": "review-model"}]})
    );
    let (_, unknown) = ws.call("session/open", json!({"agent": "writer"})).await;
    assert_eq!(
        unknown["error"]["data"]["kind"], "invalid_params",
        "{unknown}"
    );
    assert!(
        unknown["error"]["message"]
            .as_str()
            .unwrap()
            .contains("reviewer"),
        "{unknown}"
    );

    let opened = ws
        .result("session/open", json!({"agent": "reviewer"}))
        .await;
    assert_eq!(opened["agent"], "reviewer");
    assert_eq!(opened["model"], "review-model");
    let session = opened["session_id"].as_str().unwrap().to_string();
    let (_, end) = run_turn(&mut ws, &session, "check my change").await;
    assert_eq!(end["reason"], "completed", "{end}");
    let request = mock.requests().pop().unwrap();
    assert_eq!(request["model"], "review-model");
    assert!(system_of(&request).contains(REVIEWER_SAYS));
    let tools = tool_names(&request);
    assert!(tools.contains(&"read_file".to_string()), "{tools:?}");
    assert!(!tools.contains(&"write_file".to_string()), "{tools:?}");
    // Asked for anyway, the tool is refused by policy.
    let (_, invoked) = ws
        .call(
            "tool/invoke",
            json!({"session_id": session, "name": "write_file",
                   "arguments": {"path": "x.txt", "content": "no"}}),
        )
        .await;
    assert_eq!(
        invoked["error"]["data"]["kind"], "policy_denied",
        "{invoked}"
    );
    assert!(!app.workspace().join("x.txt").exists());

    // The agent is chosen at creation: re-opening as another is refused.
    let (_, again) = ws
        .call(
            "session/open",
            json!({"session_id": session, "agent": "someone-else"}),
        )
        .await;
    assert_eq!(again["error"]["data"]["kind"], "invalid_params", "{again}");
    let listed = app.get_json("/api/sessions", None).await;
    let row = listed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["session_id"] == session.as_str())
        .unwrap()
        .clone();
    assert_eq!(row["agent"], "reviewer");

    // A session without a profile is untouched by it.
    let plain = ws.open().await;
    run_turn(&mut ws, &plain, "hello").await;
    let request = mock.requests().pop().unwrap();
    assert_eq!(request["model"], super::agent::MODEL);
    assert!(!system_of(&request).contains(REVIEWER_SAYS));
    assert!(tool_names(&request).contains(&"write_file".to_string()));

    // After a restart the session is still the reviewer.
    drop(ws);
    let dir = app.stop().await;
    let mut config = crate::support::config_in(dir.path());
    with_reviewer(&mock)(&mut config);
    let app = TestApp::start_in(dir, config).await;
    let mut ws = app.ws().await;
    let reopened = ws
        .result("session/open", json!({"session_id": session}))
        .await;
    assert_eq!(reopened["agent"], "reviewer");
    run_turn(&mut ws, &session, "and now?").await;
    let request = mock.requests().pop().unwrap();
    assert_eq!(request["model"], "review-model");
    assert!(system_of(&request).contains(REVIEWER_SAYS));
    assert!(!tool_names(&request).contains(&"write_file".to_string()));
}

#[tokio::test]
async fn spawn_agent_with_an_agent_type_starts_a_child_of_that_profile() {
    let script = Script::route(|request: &Value| {
        if opener(request) == "review the notes" {
            return Reply::text(&["reviewed"]);
        }
        let messages = request["messages"].as_array().unwrap();
        let answered = |id: &str| {
            messages
                .iter()
                .any(|m| m["role"] == "tool" && m["tool_call_id"] == id)
        };
        if !answered("p0") {
            return Reply::tool_calls(vec![ScriptedCall::whole(
                "p0",
                "spawn_agent",
                &json!({"message": "never started", "agent_type": "no-such-profile"}),
            )]);
        }
        if !answered("p1") {
            return Reply::tool_calls(vec![ScriptedCall::whole(
                "p1",
                "spawn_agent",
                &json!({"message": "review the notes", "agent_type": "reviewer"}),
            )]);
        }
        if !answered("p2") {
            return Reply::tool_calls(vec![ScriptedCall::whole("p2", "wait_agent", &json!({}))]);
        }
        Reply::text(&["done"])
    });
    let mock = MockLlm::start(script).await;
    let app = TestApp::spawn_with(with_reviewer(&mock)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (_, end) = run_turn(&mut ws, &session, "delegate a review").await;
    assert_eq!(end["reason"], "completed", "{end}");

    let requests = mock.requests();
    let refusal = requests
        .iter()
        .flat_map(|r| r["messages"].as_array().unwrap().clone())
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == "p0")
        .expect("the unknown profile's answer");
    let refusal = refusal["content"].as_str().unwrap();
    assert!(
        refusal.contains("no-such-profile") && refusal.contains("reviewer"),
        "{refusal}"
    );
    assert!(
        !requests.iter().any(|r| opener(r) == "never started"),
        "no child for an unknown profile"
    );
    let child: Vec<&Value> = requests
        .iter()
        .filter(|r| opener(r) == "review the notes")
        .collect();
    assert_eq!(child.len(), 1);
    assert_eq!(child[0]["model"], "review-model");
    assert!(system_of(child[0]).contains(REVIEWER_SAYS));
    let tools = tool_names(child[0]);
    assert!(tools.contains(&"read_file".to_string()), "{tools:?}");
    assert!(!tools.contains(&"write_file".to_string()), "{tools:?}");
    // The parent stays a plain agent.
    let parent = requests
        .iter()
        .find(|r| opener(r) == "delegate a review")
        .unwrap();
    assert_eq!(parent["model"], super::agent::MODEL);
    assert!(!system_of(parent).contains(REVIEWER_SAYS));
}

/// A plugin whose program writes `plugin.txt` where it runs.
fn planting_plugin(dir: &std::path::Path) -> agentd::config::PluginConfig {
    let script = dir.join("plant.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\ncat >/dev/null\necho planted > plugin.txt\n",
    )
    .unwrap();
    let mut perms = std::fs::metadata(&script).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&script, perms).unwrap();
    agentd::config::PluginConfig {
        name: "plant".into(),
        description: "Looks at the project.".into(),
        command: script.to_string_lossy().into_owned(),
        args: Vec::new(),
        spawn_only: false,
        tags: vec!["search".into()],
        exclusive: false,
        timeout_ms: 30_000,
        input_schema: json!({"type": "object"}),
    }
}

/// A profile that may neither change files nor run commands, by the groups alone.
fn read_only() -> AgentProfile {
    AgentProfile {
        name: "read-only".into(),
        description: "Reads; changes nothing".into(),
        instructions: None,
        model: None,
        tool_policy: Some(ToolPolicy {
            deny: vec!["group:writes".into(), "group:commands".into()],
            ..ToolPolicy::default()
        }),
    }
}

/// Every file under `dir` with its content.
fn files_under(dir: &std::path::Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut found = std::collections::BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(at) = pending.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            let kind = std::fs::symlink_metadata(&path).unwrap().file_type();
            if kind.is_dir() {
                pending.push(path);
            } else {
                let name = path.strip_prefix(dir).unwrap().display().to_string();
                found.insert(name, std::fs::read(&path).unwrap_or_default());
            }
        }
    }
    found
}

/// The tools of `tool/list` that are not hidden, with their effects.
async fn listed(ws: &mut crate::support::WsClient, session: &str) -> Vec<(String, Value)> {
    let list = ws.result("tool/list", json!({"session_id": session})).await;
    ["active", "deferred"]
        .iter()
        .flat_map(|part| list[*part].as_array().unwrap().clone())
        .map(|info| {
            (
                info["name"].as_str().unwrap().to_string(),
                info["effects"].clone(),
            )
        })
        .collect()
}

/// Tools of the full server registry, model and plugin included, reviewed as changing no file
/// and running no command. A new tool must be flagged or added here: one that writes without
/// saying so cannot slip past both.
const REVIEWED_READ_ONLY: &[&str] = &[
    "activate_tools",
    "check_background_tasks",
    "close_agent",
    "glob",
    "grep",
    "image_generation",
    "list_dir",
    "read_file",
    "read_task_output",
    "request_user_input",
    "resume_agent",
    "run_pipeline",
    "send_input",
    "skill",
    "spawn_agent",
    "tool_search",
    "tool_suggest",
    "update_plan",
    "view_image",
    "wait_agent",
    "web_fetch",
    "web_search",
    "workspace_diff",
    "workspace_log",
];

/// Tools known to change files; the command runners among them also run commands.
const KNOWN_WRITERS: &[&str] = &[
    "apply_patch",
    "diff_edit",
    "edit_file",
    "exec_command",
    "plant",
    "shell",
    "write_file",
    "write_stdin",
];
const KNOWN_COMMAND_RUNNERS: &[&str] = &["exec_command", "plant", "shell", "write_stdin"];

#[tokio::test]
async fn every_registered_tool_says_whether_it_writes_or_runs_commands() {
    let scripts = tempfile::tempdir().unwrap();
    let plugin = planting_plugin(scripts.path());
    let mock = MockLlm::start(Script::always(Reply::text(&["ok"]))).await;
    let configure = with_model(&mock);
    let app = TestApp::spawn_with(move |c: &mut Config| {
        configure(c);
        c.plugins.push(plugin);
        c.agents.push(read_only());
    })
    .await;
    let mut ws = app.ws().await;
    let plain = ws.open().await;
    let tools = listed(&mut ws, &plain).await;
    assert!(tools.len() > 25, "the full registry: {tools:?}");
    for (name, effects) in &tools {
        let flag = |key: &str| {
            effects[key]
                .as_bool()
                .unwrap_or_else(|| panic!("{name} does not state {key}: {effects}"))
        };
        let (writes, commands) = (flag("writes_files"), flag("runs_commands"));
        flag("reaches_network");
        assert_eq!(
            writes,
            KNOWN_WRITERS.contains(&name.as_str()),
            "{name} writes: {effects}"
        );
        assert_eq!(
            commands,
            KNOWN_COMMAND_RUNNERS.contains(&name.as_str()),
            "{name} runs commands: {effects}"
        );
        assert!(
            writes || REVIEWED_READ_ONLY.contains(&name.as_str()),
            "{name} is neither flagged as writing nor reviewed as read-only"
        );
    }

    // Denying the two groups leaves none of them.
    let opened = ws
        .result("session/open", json!({"agent": "read-only"}))
        .await;
    let session = opened["session_id"].as_str().unwrap().to_string();
    let left: Vec<String> = listed(&mut ws, &session)
        .await
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    for name in KNOWN_WRITERS {
        assert!(!left.contains(&name.to_string()), "{name} stays: {left:?}");
    }
    assert!(left.contains(&"read_file".to_string()), "{left:?}");
    assert!(left.contains(&"spawn_agent".to_string()), "{left:?}");
}

/// Hostile: a model working as a profile that denies `group:writes` and `group:commands` tries
/// every way to change the workspace it knows, itself and through a sub-agent. Before the
/// groups existed the deny list named nothing and every one of these calls ran.
#[tokio::test]
async fn a_profile_denying_writes_and_commands_changes_nothing_children_included() {
    let scripts = tempfile::tempdir().unwrap();
    let plugin = planting_plugin(scripts.path());
    let attempts = |prefix: &str| {
        let call = |n: usize, name: &str, arguments: Value| {
            ScriptedCall::whole(&format!("{prefix}{n}"), name, &arguments)
        };
        vec![
            call(0, "write_file", json!({"path": "new.txt", "content": "x"})),
            call(
                1,
                "edit_file",
                json!({"path": "keep.txt", "old_string": "kept", "new_string": "gone"}),
            ),
            call(
                2,
                "diff_edit",
                json!({"path": "keep.txt", "diff": "@@ -1 +1 @@\n-kept\n+gone\n"}),
            ),
            call(
                3,
                "apply_patch",
                json!({"input": "*** Begin Patch\n*** Delete File: keep.txt\n*** End Patch"}),
            ),
            call(
                4,
                "shell",
                json!({"command": "rm keep.txt; touch shell.txt"}),
            ),
            call(5, "exec_command", json!({"cmd": "touch exec.txt"})),
            call(6, "plant", json!({})),
        ]
    };
    let (parent_calls, child_calls) = (attempts("p"), attempts("c"));
    let script = Script::route(move |request: &Value| {
        let messages = request["messages"].as_array().unwrap();
        let answered = |id: &str| {
            messages
                .iter()
                .any(|m| m["role"] == "tool" && m["tool_call_id"] == id)
        };
        if opener(request) == "change everything" {
            return if answered("c0") {
                Reply::text(&["could not"])
            } else {
                Reply::tool_calls(child_calls.clone())
            };
        }
        if !answered("p0") {
            return Reply::tool_calls(parent_calls.clone());
        }
        if !answered("s0") {
            return Reply::tool_calls(vec![ScriptedCall::whole(
                "s0",
                "spawn_agent",
                &json!({"message": "change everything"}),
            )]);
        }
        if !answered("s1") {
            return Reply::tool_calls(vec![ScriptedCall::whole("s1", "wait_agent", &json!({}))]);
        }
        Reply::text(&["done"])
    });
    let mock = MockLlm::start(script).await;
    let configure = with_model(&mock);
    let app = TestApp::spawn_with(move |c: &mut Config| {
        configure(c);
        c.plugins.push(plugin);
        c.agents.push(read_only());
    })
    .await;
    std::fs::write(app.workspace().join("keep.txt"), "kept\n").unwrap();
    let mut ws = app.ws().await;
    let opened = ws
        .result("session/open", json!({"agent": "read-only"}))
        .await;
    let session = opened["session_id"].as_str().unwrap().to_string();
    let before = files_under(&app.workspace());

    let (_, end) = run_turn(&mut ws, &session, "try to write").await;
    assert_eq!(end["reason"], "completed", "{end}");

    assert_eq!(
        files_under(&app.workspace()),
        before,
        "the workspace changed"
    );
    let requests = mock.requests();
    let child: Vec<&Value> = requests
        .iter()
        .filter(|r| opener(r) == "change everything")
        .collect();
    assert!(!child.is_empty(), "the child ran");
    for request in requests.iter() {
        let tools = tool_names(request);
        for name in KNOWN_WRITERS {
            assert!(
                !tools.contains(&name.to_string()),
                "{name} offered: {tools:?}"
            );
        }
    }
    // Every attempt, the parent's and the child's, was answered with a refusal.
    let answers: Vec<Value> = requests
        .iter()
        .flat_map(|r| r["messages"].as_array().unwrap().clone())
        .filter(|m| m["role"] == "tool")
        .collect();
    for prefix in ["p", "c"] {
        for n in 0..7 {
            let id = format!("{prefix}{n}");
            let answer = answers
                .iter()
                .find(|m| m["tool_call_id"] == id.as_str())
                .unwrap_or_else(|| panic!("{id} was not answered"));
            let text = answer["content"].as_str().unwrap_or_default();
            assert!(text.contains("is not allowed here"), "{id}: {text}");
        }
    }
}
