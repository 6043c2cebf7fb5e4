//! A session exported as JSON Lines and imported as a new session that carries on.

use serde_json::{Value, json};

use crate::suite::agent::run_turn;
use crate::support::TestApp;
use crate::support::mock_llm::{MockLlm, Reply, Script};

#[tokio::test]
async fn an_exported_session_imports_as_a_new_one_that_carries_on() {
    let mock = MockLlm::start(Script::always(Reply::text(&["noted"]))).await;
    let base_url = mock.base_url();
    let app = TestApp::spawn_with(move |c| {
        c.llm.base_url = Some(base_url);
        c.llm.model = Some("test-model".into());
    })
    .await;
    std::fs::create_dir_all(app.workspace().join("proj")).unwrap();
    let mut ws = app.ws().await;
    let opened = ws.result("session/open", json!({"cwd": "proj"})).await;
    let source = opened["session_id"].as_str().unwrap().to_string();
    let (_, end) = run_turn(&mut ws, &source, "remember the number 42").await;
    assert_eq!(end["reason"], "completed", "{end}");

    let response = reqwest::get(app.url(&format!("/api/sessions/{source}/export")))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/jsonl");
    let body = response.text().await.unwrap();
    let lines: Vec<Value> = body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["type"], "session");
    assert_eq!(lines[0]["session_id"], source.as_str());
    assert_eq!(lines[0]["cwd"], "proj");
    let kinds: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"message") && kinds.contains(&"event") && kinds.contains(&"cost"));

    let imported = reqwest::Client::new()
        .post(app.url("/api/sessions/import"))
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(imported.status(), 201);
    let imported: Value = imported.json().await.unwrap();
    let copy = imported["session_id"].as_str().unwrap().to_string();
    assert_ne!(copy, source);
    assert_eq!(imported["cwd"], "proj");
    assert_eq!(imported["title"], lines[0]["title"]);

    // The same history and cost; the events replay under the new id, gapless.
    let get = async |path: String| app.get_json(&path, None).await;
    assert_eq!(
        get(format!("/api/sessions/{copy}/messages")).await,
        get(format!("/api/sessions/{source}/messages")).await
    );
    assert_eq!(
        get(format!("/api/sessions/{copy}/cost")).await["session_cost_usd"],
        get(format!("/api/sessions/{source}/cost")).await["session_cost_usd"]
    );
    let mut other = app.ws().await;
    let (events, _) = other
        .call("session/open", json!({"session_id": copy, "after_seq": 0}))
        .await;
    let replayed: Vec<&Value> = events.iter().filter(|e| e["method"].is_string()).collect();
    let exported = lines.iter().filter(|l| l["type"] == "event").count();
    assert_eq!(replayed.len(), exported);
    for (at, event) in replayed.iter().enumerate() {
        assert_eq!(event["params"]["session_id"], copy.as_str());
        assert_eq!(event["params"]["seq"], at as i64 + 1);
    }

    // It carries on: the next turn's request holds the imported conversation.
    let (_, end) = run_turn(&mut other, &copy, "what was the number?").await;
    assert_eq!(end["reason"], "completed", "{end}");
    let last = mock.requests().last().unwrap().to_string();
    assert!(last.contains("remember the number 42"), "{last}");

    // What is not an export is refused, in the one error shape.
    for bad in ["", "not json", "{\"type\":\"event\"}"] {
        let refused = reqwest::Client::new()
            .post(app.url("/api/sessions/import"))
            .body(bad)
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 400, "{bad}");
        let error: Value = refused.json().await.unwrap();
        assert_eq!(error["error"]["kind"], "invalid_params", "{bad}");
    }
    let (status, _) = app.get("/api/sessions/nope/export", None).await;
    assert_eq!(status, 404);
}
