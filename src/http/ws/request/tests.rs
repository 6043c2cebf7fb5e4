//! Reading requests: every method maps to its variant, and a params error answers exactly
//! what reading the params type alone answers.

use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::*;
use crate::http::ws::rpc::response;
use crate::session::Outbound;

/// The answer frame `outcome` makes, as JSON.
fn frame(outcome: Result<Value, RpcError>) -> Value {
    match response(None, outcome) {
        Outbound::Text(text) => serde_json::from_str(&text).unwrap(),
        Outbound::Close(..) => panic!("an answer is a text frame"),
    }
}

/// The error a request's params get, which must be the one reading them as `T` alone gets.
fn params_error<T: DeserializeOwned>(method: &str, params: Value) -> Value {
    let alone = if params.is_null() {
        json!({})
    } else {
        params.clone()
    };
    let Err(expected) = serde_json::from_value::<T>(alone).map_err(RpcError::params) else {
        panic!("{method} {params} reads as its params type");
    };
    let Err(got) = Request::read(method, params.clone()) else {
        panic!("{method} {params} reads as a request");
    };
    let (got, expected) = (frame(Err(got)), frame(Err(expected)));
    assert_eq!(got, expected, "{method} {params}");
    got["error"].clone()
}

/// The method a request was read from, by its variant.
fn method_of(request: &Request) -> &'static str {
    match request {
        Request::SessionOpen(_) => "session/open",
        Request::ModelList(_) => "model/list",
        Request::AgentList(_) => "agent/list",
        Request::SessionFork(_) => "session/fork",
        Request::SessionCompact(_) => "session/compact",
        Request::SessionUpdate(_) => "session/update",
        Request::SessionRevert(_) => "session/revert",
        Request::SessionMerge(_) => "session/merge",
        Request::SessionDiscard(_) => "session/discard",
        Request::ToolInvoke(_) => "tool/invoke",
        Request::ToolList(_) => "tool/list",
        Request::TurnStart(_) => "turn/start",
        Request::TurnInterrupt(_) => "turn/interrupt",
        Request::TurnSteer(_) => "turn/steer",
        Request::UserInputRespond(_) => "user_input/respond",
        Request::ApprovalRespond(_) => "approval/respond",
        Request::TaskList(_) => "task/list",
        Request::TaskOutputRead(_) => "task/output/read",
        Request::TaskCancel(_) => "task/cancel",
        Request::Unknown => "",
    }
}

#[test]
fn every_method_reads_as_its_variant() {
    let session = json!({"session_id": "s1"});
    let task = json!({"session_id": "s1", "task_id": "t1", "mode": "tail", "lines": 3});
    let cases = [
        ("session/open", Value::Null),
        ("session/fork", json!({"session_id": "s1", "up_to_seq": 7})),
        ("tool/invoke", json!({"session_id": "s1", "name": "read"})),
        ("tool/list", session.clone()),
        ("session/compact", session.clone()),
        ("session/update", json!({"session_id": "s1", "title": "T"})),
        (
            "session/revert",
            json!({"session_id": "s1", "turn_id": "t1", "dry_run": true}),
        ),
        (
            "turn/start",
            json!({"session_id": "s1", "input": [{"kind": "text", "text": "hi"}]}),
        ),
        ("turn/interrupt", session.clone()),
        (
            "session/merge",
            json!({"session_id": "s1", "message": "Fix it"}),
        ),
        ("session/discard", session.clone()),
        (
            "turn/steer",
            json!({"session_id": "s1", "turn_id": "t1", "input": [{"kind": "text", "text": "more"}]}),
        ),
        (
            "user_input/respond",
            json!({"session_id": "s1", "request_id": "r1", "answers": {"q": "a"}}),
        ),
        (
            "approval/respond",
            json!({"session_id": "s1", "approval_id": "a1", "decision": "accept_for_session"}),
        ),
        ("task/list", session),
        ("task/output/read", task.clone()),
        ("task/cancel", task),
        ("model/list", Value::Null),
        ("agent/list", json!({})),
    ];
    for (method, params) in cases {
        let request = Request::read(method, params).unwrap_or_else(|err| {
            panic!("{method}: {}", frame(Err(err)));
        });
        assert_eq!(method_of(&request), method);
        let read = match request {
            Request::SessionFork(p) => {
                p.session_id == "s1" && p.up_to_seq == Some(7) && p.cwd.is_none()
            }
            Request::SessionOpen(p) => {
                p.session_id.is_none() && p.cwd.is_none() && p.after_seq.is_none()
            }
            Request::SessionUpdate(p) => p.session_id == "s1" && p.title == "T",
            Request::SessionRevert(p) => p.session_id == "s1" && p.turn_id == "t1" && p.dry_run,
            Request::SessionMerge(p) => {
                p.session_id == "s1" && p.message.as_deref() == Some("Fix it")
            }
            Request::ToolInvoke(p) => p.name == "read" && p.arguments.is_null() && !p.skip_approval,
            Request::TurnStart(p) => p.input().unwrap().0 == "hi" && p.turn_id.is_none(),
            Request::TurnSteer(p) => p.text().unwrap() == "more" && p.turn_id == "t1",
            Request::UserInputRespond(p) => p.request_id == "r1" && p.answers == json!({"q": "a"}),
            Request::ApprovalRespond(p) => {
                p.approval_id == "a1"
                    && p.decision == crate::agent::approval::Decision::AcceptForSession
                    && p.message.is_none()
            }
            Request::ToolList(p)
            | Request::TurnInterrupt(p)
            | Request::TaskList(p)
            | Request::SessionDiscard(p)
            | Request::SessionCompact(p) => p.session_id == "s1",
            Request::TaskOutputRead(p) | Request::TaskCancel(p) => {
                p.task_id == "t1" && p.output.mode.as_deref() == Some("tail")
            }
            Request::ModelList(_) | Request::AgentList(_) => true,
            Request::Unknown => false,
        };
        assert!(read, "{method}");
    }
}

#[test]
fn an_unknown_method_reads_whatever_its_params() {
    for params in [
        Value::Null,
        json!({}),
        json!([1, 2]),
        json!("x"),
        json!(7),
        json!({"session_id": 5}),
    ] {
        for method in ["no/such", "", "Session/Open", "session/open "] {
            assert!(
                matches!(Request::read(method, params.clone()), Ok(Request::Unknown)),
                "{method:?} {params}"
            );
        }
    }
}

#[test]
fn params_errors_read_as_the_params_type_alone() {
    let error = params_error::<SessionParams>("tool/list", json!({}));
    assert_eq!(
        error,
        json!({"code": -32602, "message": "missing field `session_id`", "data": {"kind": "invalid_params"}})
    );
    params_error::<SessionParams>("task/list", Value::Null);
    params_error::<SessionParams>("turn/interrupt", json!({"session_id": 5}));
    params_error::<SessionParams>("tool/list", json!("s1"));
    params_error::<SessionParams>("tool/list", json!([]));
    params_error::<SessionParams>("tool/list", json!(true));
    params_error::<OpenParams>("session/open", json!({"after_seq": "3"}));
    params_error::<OpenParams>("session/open", json!({"after_seq": 1.5}));
    params_error::<InvokeParams>("tool/invoke", json!({"session_id": "s1"}));
    params_error::<TurnParams>("turn/start", json!({"session_id": "s1"}));
    let error = params_error::<TurnParams>(
        "turn/start",
        json!({"session_id": "s1", "input": [{"kind": "video"}]}),
    );
    assert_eq!(
        error["message"],
        "unknown variant `video`, expected `text` or `image`"
    );
    params_error::<TurnParams>("turn/start", json!({"session_id": "s1", "input": "hi"}));
    params_error::<RespondParams>(
        "user_input/respond",
        json!({"session_id": "s1", "request_id": "r1"}),
    );
    params_error::<TaskParams>("task/cancel", json!({"session_id": "s1"}));
    params_error::<TaskParams>(
        "task/output/read",
        json!({"session_id": "s1", "task_id": "t1", "lines": "3"}),
    );
    params_error::<TaskParams>(
        "task/output/read",
        json!({"session_id": "s1", "task_id": "t1", "lines": -1}),
    );
}

#[test]
fn params_by_position_and_extra_members_read_as_before() {
    // A derived struct also takes an array, by position, and ignores members it does not know.
    assert!(matches!(
        Request::read("task/list", json!(["s1"])),
        Ok(Request::TaskList(SessionParams { session_id })) if session_id == "s1"
    ));
    assert!(matches!(
        Request::read("tool/list", json!({"session_id": "s1", "method": "x", "params": 1})),
        Ok(Request::ToolList(SessionParams { session_id })) if session_id == "s1"
    ));
}

#[test]
fn a_turn_needs_text() {
    let Ok(Request::TurnStart(params)) =
        Request::read("turn/start", json!({"session_id": "s1", "input": []}))
    else {
        panic!("an empty input still reads");
    };
    let error = frame(Err(params.input().unwrap_err()));
    assert_eq!(
        error["error"],
        json!({
            "code": -32602,
            "message": "input needs at least one {kind: \"text\", text} or {kind: \"image\"} item",
            "data": {"kind": "invalid_params"},
        })
    );
    let Ok(Request::TurnStart(params)) = Request::read(
        "turn/start",
        json!({"session_id": "s1", "input": [{"kind": "text", "text": "a"}, {"kind": "text", "text": "b"}]}),
    ) else {
        panic!("two text items read");
    };
    assert_eq!(params.input().unwrap().0, "a\nb");
}
