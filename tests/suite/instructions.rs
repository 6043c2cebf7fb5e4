//! What a repository and the operator tell the agent: `[instructions]`, the `AGENTS.md` files
//! from the workspace root down to the session's cwd, and skills loaded with `skill`.

use serde_json::{Value, json};

use crate::suite::agent::run_turn;
use crate::support::TestApp;
use crate::support::mock_llm::{MockLlm, Reply, Script, ScriptedCall};

fn system_prompt(request: &Value) -> String {
    let first = &request["messages"][0];
    assert_eq!(first["role"], "system", "{request}");
    first["content"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn agents_files_root_first_skills_on_demand_and_an_edit_counts_from_the_next_turn() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::tool_calls(vec![ScriptedCall::whole(
            "c1",
            "skill",
            &json!({"name": "deploy"}),
        )]),
        Reply::text(&["deployed"]),
        Reply::text(&["again"]),
    ]))
    .await;
    let base_url = mock.base_url();
    let app = TestApp::spawn_with(move |c| {
        c.llm.base_url = Some(base_url);
        c.llm.model = Some("test-model".into());
        c.instructions.text = Some("OPERATOR-RULES".into());
    })
    .await;
    let workspace = app.workspace();
    let write = |rel: &str, text: &str| {
        let path = workspace.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("AGENTS.md", "ROOT-RULES\n");
    write("proj/AGENTS.md", "PROJ-RULES\n");
    write("other/AGENTS.md", "NOT-ON-THE-WAY\n");
    write(
        "proj/.agents/skills/deploy/SKILL.md",
        "---\nname: deploy\ndescription: Deploys the service to staging.\n---\nDEPLOY-BODY: run ./run.sh\n",
    );
    write("proj/.agents/skills/deploy/run.sh", "echo deploy\n");

    let mut ws = app.ws().await;
    let opened = ws.result("session/open", json!({"cwd": "proj"})).await;
    assert_eq!(
        opened["instructions"],
        json!([
            {"path": "[instructions]", "bytes": 14, "cut": false},
            {"path": "AGENTS.md", "bytes": 11, "cut": false},
            {"path": "proj/AGENTS.md", "bytes": 11, "cut": false},
        ]),
        "{opened}"
    );
    let session = opened["session_id"].as_str().unwrap().to_string();
    let (_, end) = run_turn(&mut ws, &session, "ship it").await;
    assert_eq!(end["reason"], "completed", "{end}");

    let requests = mock.requests();
    let prompt = system_prompt(&requests[0]);
    let at = |needle: &str| {
        prompt
            .find(needle)
            .unwrap_or_else(|| panic!("{needle} not in {prompt}"))
    };
    assert!(at("OPERATOR-RULES") < at("ROOT-RULES") && at("ROOT-RULES") < at("PROJ-RULES"));
    assert!(prompt.contains("- deploy: Deploys the service to staging."));
    assert!(!prompt.contains("NOT-ON-THE-WAY") && !prompt.contains("DEPLOY-BODY"));
    // The skill's body comes with the tool's answer, with its other files.
    let tool = requests[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(tool.contains("DEPLOY-BODY"), "{tool}");
    assert!(tool.contains(".agents/skills/deploy/run.sh"), "{tool}");
    assert!(!tool.contains("name: deploy"), "front matter shown: {tool}");
    // Nothing changed within the turn: the same bytes, which the prompt cache needs.
    assert_eq!(system_prompt(&requests[1]), prompt);

    // An edited file counts from the next turn.
    write("proj/AGENTS.md", "PROJ-RULES-V2\n");
    let (_, end) = run_turn(&mut ws, &session, "and again").await;
    assert_eq!(end["reason"], "completed", "{end}");
    let next = system_prompt(&mock.requests()[2]);
    assert!(next.contains("PROJ-RULES-V2"), "{next}");

    // An unknown skill is refused with the names there are.
    let (_, answer) = ws
        .call(
            "tool/invoke",
            json!({"session_id": session, "name": "skill", "arguments": {"name": "nope"}}),
        )
        .await;
    let output = answer["result"]["output"].as_str().unwrap_or_default();
    assert!(output.contains("deploy"), "{answer}");
}

/// Alice's repository holds a 1 TiB `AGENTS.md` (sparse: no disk) and 300 skills whose
/// descriptions run to 100 KiB each, one of them a 1 TiB `SKILL.md`. Her sessions open, her
/// model requests stay within `max_bytes`, and Bob, on the same server, works as before.
#[tokio::test]
async fn a_tebibyte_agents_file_and_a_flood_of_skills_cost_their_budget_only() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::text(&["alice done"]),
        Reply::text(&["bob done"]),
    ]))
    .await;
    let base_url = mock.base_url();
    let app = TestApp::spawn_with(move |c| {
        c.llm.base_url = Some(base_url);
        c.llm.model = Some("test-model".into());
        c.instructions.max_bytes = 16 * 1024;
        c.instructions.max_skills = 50;
        c.server.users = ["alice", "bob"]
            .map(|name| agentd::config::UserConfig {
                name: name.into(),
                token: agentd::config::Secret::new(format!("{name}-token")),
            })
            .to_vec();
    })
    .await;
    let alice_root = app.workspace().join("alice");
    std::fs::create_dir_all(alice_root.join("proj")).unwrap();
    let huge = std::fs::File::create(alice_root.join("proj/AGENTS.md")).unwrap();
    huge.set_len(1 << 40).unwrap();
    let long_description = "x".repeat(100 * 1024);
    for n in 0..300 {
        let dir = alice_root.join(format!("proj/.agents/skills/s{n:03}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("SKILL.md"),
            format!("---\nname: s{n:03}\ndescription: {long_description}\n---\nbody\n"),
        )
        .unwrap();
    }
    let sparse_skill = alice_root.join("proj/.agents/skills/s000/SKILL.md");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&sparse_skill)
        .unwrap()
        .set_len(1 << 40)
        .unwrap();

    let mut alice = app.ws_with(Some("alice-token"), None).await.unwrap();
    let opened = alice.result("session/open", json!({"cwd": "proj"})).await;
    assert_eq!(
        opened["instructions"],
        json!([{"path": "proj/AGENTS.md", "bytes": 1u64 << 40, "cut": true}]),
        "{opened}"
    );
    let session = opened["session_id"].as_str().unwrap().to_string();
    let (_, end) = run_turn(&mut alice, &session, "hi").await;
    assert_eq!(end["reason"], "completed", "{end}");
    let prompt = system_prompt(&mock.requests()[0]);
    let base = agentd::agent::SYSTEM_PROMPT.len();
    // The budget, plus the headings and cut notes the prompt puts around what it took.
    assert!(
        prompt.len() < base + 16 * 1024 + 1024,
        "{} bytes",
        prompt.len()
    );
    assert!(prompt.contains("[cut: more skills"), "{prompt}");

    let mut bob = app.ws_with(Some("bob-token"), None).await.unwrap();
    let opened = bob.result("session/open", json!({})).await;
    let session = opened["session_id"].as_str().unwrap().to_string();
    let (_, end) = run_turn(&mut bob, &session, "hi").await;
    assert_eq!(end["reason"], "completed", "{end}");
}
