//! Turns over REST: started at once (202) or waited for (200 with the answer), and what
//! happens to one started while another runs (`multitask`).

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::support::TestApp;
use crate::support::mock_llm::{MockLlm, Reply, Script};

async fn post_turn(app: &TestApp, session: &str, query: &str, body: Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(app.url(&format!("/api/sessions/{session}/turns{query}")))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

fn say(text: &str) -> Value {
    json!([{"kind": "text", "text": text}])
}

#[tokio::test]
async fn rest_turns_start_wait_queue_and_interrupt() {
    let first_hold = Arc::new(Notify::new());
    let second_hold = Arc::new(Notify::new());
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::text(&["done"]),
        Reply::hold(&["slow "], Arc::clone(&first_hold), &["answer"]),
        Reply::text(&["queued one"]),
        Reply::hold(&["never "], Arc::clone(&second_hold), &["finished"]),
        Reply::text(&["after the interrupt"]),
    ]))
    .await;
    let base_url = mock.base_url();
    let app = TestApp::spawn_with(move |c| {
        c.llm.base_url = Some(base_url);
        c.llm.model = Some("test-model".into());
    })
    .await;
    let mut ws = app.ws().await;
    let session = ws.open().await;

    // Waited for: the answer, how it ended, what it cost.
    let (status, done) = post_turn(&app, &session, "?wait=true", json!({"input": say("hi")})).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["status"], "completed");
    assert_eq!(done["reason"], "completed");
    assert_eq!(done["text"], "done");
    assert!(
        done["cost_usd"].is_number() && done["turn_id"].is_string(),
        "{done}"
    );

    // Started at once; a second one is refused while it runs, or queued behind it.
    let (status, started) = post_turn(&app, &session, "", json!({"input": say("slow")})).await;
    assert_eq!(status, 202, "{started}");
    let (status, refused) = post_turn(&app, &session, "", json!({"input": say("again")})).await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"]["kind"], "turn_in_progress");
    let queued = {
        let url = app.url(&format!("/api/sessions/{session}/turns?wait=true"));
        tokio::spawn(async move {
            let response = reqwest::Client::new()
                .post(url)
                .json(&json!({"input": say("queued"), "multitask": "queue"}))
                .send()
                .await
                .unwrap();
            (
                response.status().as_u16(),
                response.json::<Value>().await.unwrap(),
            )
        })
    };
    // The queued request waits for the running turn, which ends only when released.
    tokio::task::yield_now().await;
    first_hold.notify_one();
    let (status, queued) = queued.await.unwrap();
    assert_eq!(
        (status, queued["text"].as_str()),
        (200, Some("queued one")),
        "{queued}"
    );

    // Interrupting: the running turn stops, the new one runs.
    let (status, _) = post_turn(&app, &session, "", json!({"input": say("long")})).await;
    assert_eq!(status, 202);
    // Its model call is under way (and held) before it is interrupted.
    mock.wait_for_requests(4, crate::support::WAIT).await;
    let replacing = {
        let url = app.url(&format!("/api/sessions/{session}/turns?wait=true"));
        tokio::spawn(async move {
            let response = reqwest::Client::new()
                .post(url)
                .json(&json!({"input": say("instead"), "multitask": "interrupt"}))
                .send()
                .await
                .unwrap();
            (
                response.status().as_u16(),
                response.json::<Value>().await.unwrap(),
            )
        })
    };
    // Once the long turn is interrupted, the mock's held answer (which nobody reads any
    // more) is let go, so the mock serves the next request.
    let interrupted = loop {
        let events = app.replay(&session).await;
        let errors: Vec<Value> = events
            .into_iter()
            .filter(|e| e["method"] == "turn/error")
            .collect();
        if !errors.is_empty() {
            break errors;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(interrupted.len(), 1, "{interrupted:?}");
    assert_eq!(interrupted[0]["params"]["code"], "interrupted");
    second_hold.notify_one();
    let (status, replaced) = replacing.await.unwrap();
    assert_eq!(status, 200, "{replaced}");
    assert_eq!(replaced["text"], "after the interrupt", "{replaced}");

    // What cannot be a turn is refused in the one error shape.
    let (status, bad) = post_turn(&app, &session, "", json!({"input": []})).await;
    assert_eq!(
        (status, bad["error"]["kind"].as_str()),
        (400, Some("invalid_params"))
    );
    let (status, bad) = post_turn(
        &app,
        &session,
        "",
        json!({"input": say("x"), "multitask": "later"}),
    )
    .await;
    assert_eq!(status, 400, "{bad}");
    let (status, missing) = post_turn(&app, "nope", "", json!({"input": say("x")})).await;
    assert_eq!(
        (status, missing["error"]["kind"].as_str()),
        (404, Some("unknown_session"))
    );
}

#[tokio::test]
async fn a_rest_turn_with_multitask_steer_joins_the_running_turn() {
    use crate::support::mock_llm::ScriptedCall;
    let questions = json!({"questions": [{"id": "go", "header": "Go", "question": "Go on?"}]});
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::tool_calls(vec![ScriptedCall::whole(
            "ask_1",
            "request_user_input",
            &questions,
        )]),
        Reply::text(&["steered answer"]),
        Reply::text(&["a turn of its own"]),
    ]))
    .await;
    let base_url = mock.base_url();
    let app = TestApp::spawn_with(move |c| {
        c.llm.base_url = Some(base_url);
        c.llm.model = Some("test-model".into());
    })
    .await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (status, started) = post_turn(&app, &session, "", json!({"input": say("start")})).await;
    assert_eq!(status, 202, "{started}");
    // The turn waits for the user, so it is running when the steer comes.
    let asked = ws.notification("user_input/requested").await;
    let (status, with_image) = post_turn(
        &app,
        &session,
        "",
        json!({"input": [{"kind": "image", "path": "x.png"}], "multitask": "steer"}),
    )
    .await;
    assert_eq!(status, 400, "{with_image}");
    let (status, steered) = post_turn(
        &app,
        &session,
        "",
        json!({"input": say("also check the tests"), "multitask": "steer"}),
    )
    .await;
    assert_eq!(status, 202, "{steered}");
    assert_eq!(steered["turn_id"], started["turn_id"], "the running turn");
    assert_eq!(steered["steered"], true);
    ws.result(
        "user_input/respond",
        json!({"session_id": session, "request_id": asked["request_id"], "answers": {"go": "yes"}}),
    )
    .await;
    let done = ws.notification("turn/completed").await;
    assert_eq!(done["turn_id"], started["turn_id"]);
    let second = &mock.requests()[1];
    let steer_seen = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["role"] == "user" && m["content"] == "also check the tests");
    assert!(steer_seen, "{second}");
    // With no turn running, a steer starts one of its own.
    let (status, own) = post_turn(
        &app,
        &session,
        "?wait=true",
        json!({"input": say("a new task"), "multitask": "steer"}),
    )
    .await;
    assert_eq!(status, 200, "{own}");
    assert_eq!(own["steered"], false);
    assert_eq!(own["text"], "a turn of its own");
}
