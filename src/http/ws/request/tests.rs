//! Reading requests: every method maps to its variant, a session's method straight into its
//! `SessionRequest`, and a params error answers what reading the params alone answers.

use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::*;
use crate::agent::approval::Decision;
use crate::http::ws::rpc::response;
use crate::session::{Outbound, RevertTo};

/// The answer frame `outcome` makes, as JSON.
fn frame(outcome: Result<Value, RpcError>) -> Value {
    match response(None, outcome) {
        Outbound::Text(text) => serde_json::from_str(&text).unwrap(),
        Outbound::Close(..) => panic!("an answer is a text frame"),
    }
}

/// The error a connection method's params get, which must be the one reading them as `T`
/// alone gets.
fn params_error<T: DeserializeOwned>(method: &str, params: Value) -> Value {
    let alone = if params.is_null() {
        json!({})
    } else {
        params.clone()
    };
    let Err(expected) = serde_json::from_value::<T>(alone).map_err(RpcError::params) else {
        panic!("{method} {params} reads as its params type");
    };
    let (got, expected) = (frame(Err(refusal(method, params))), frame(Err(expected)));
    assert_eq!(got, expected, "{method}");
    got["error"].clone()
}

/// The refusal reading `method` with `params` gets.
fn refusal(method: &str, params: Value) -> RpcError {
    let Err(got) = Request::read(method, params.clone()) else {
        panic!("{method} {params} reads as a request");
    };
    got
}

/// The message of the refusal reading `method` with `params` gets; its kind is
/// `invalid_params`.
fn refused_with(method: &str, params: Value) -> String {
    let error = frame(Err(refusal(method, params)))["error"].clone();
    assert_eq!(error["code"], -32602, "{error}");
    assert_eq!(error["data"]["kind"], "invalid_params", "{error}");
    error["message"].as_str().unwrap().to_string()
}

/// The session request `method` with `params` reads as, for the session `s1`.
fn session_request(method: &str, params: Value) -> SessionRequest {
    match Request::read(method, params) {
        Ok(Request::Session {
            session_id,
            request,
        }) => {
            assert_eq!(session_id, "s1");
            assert_eq!(request.method(), method);
            request
        }
        Ok(_) => panic!("{method} is a session's method"),
        Err(err) => panic!("{method}: {}", frame(Err(err))),
    }
}

#[test]
fn the_connections_methods_read_as_their_variants() {
    let session = json!({"session_id": "s1"});
    let task = json!({"session_id": "s1", "task_id": "t1", "mode": "tail", "lines": 3});
    let cases = [
        ("session/open", Value::Null),
        ("session/fork", json!({"session_id": "s1", "up_to_seq": 7})),
        ("session/update", json!({"session_id": "s1", "title": "T"})),
        (
            "session/merge",
            json!({"session_id": "s1", "message": "Fix it"}),
        ),
        ("session/discard", session.clone()),
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
        assert_eq!(request.method(), Some(method));
        let Request::Connection(own) = request else {
            panic!("{method} is the connection's");
        };
        let read = match own {
            ConnectionRequest::SessionFork(p) => {
                p.session_id == "s1" && p.up_to_seq == Some(7) && p.cwd.is_none()
            }
            ConnectionRequest::SessionOpen(p) => {
                p.session_id.is_none() && p.cwd.is_none() && p.after_seq.is_none()
            }
            ConnectionRequest::SessionUpdate(p) => p.session_id == "s1" && p.title == "T",
            ConnectionRequest::SessionMerge(p) => {
                p.session_id == "s1" && p.message.as_deref() == Some("Fix it")
            }
            ConnectionRequest::TaskList(p) | ConnectionRequest::SessionDiscard(p) => {
                p.session_id == "s1"
            }
            ConnectionRequest::TaskOutputRead(p) | ConnectionRequest::TaskCancel(p) => {
                p.task_id == "t1" && p.output.mode.as_deref() == Some("tail")
            }
            ConnectionRequest::ModelList(_) | ConnectionRequest::AgentList(_) => true,
            ConnectionRequest::Other => false,
        };
        assert!(read, "{method}");
    }
}

#[test]
fn a_sessions_methods_read_straight_into_its_requests() {
    let read = |method, params| session_request(method, params);
    assert!(matches!(
        read("tool/invoke", json!({"session_id": "s1", "name": "read"})),
        SessionRequest::InvokeTool { name, arguments, skip_approval: false, tool_call_id: None, .. }
            if name == "read" && arguments.is_null()
    ));
    assert!(matches!(
        read("tool/list", json!({"session_id": "s1"})),
        SessionRequest::ToolList {}
    ));
    assert!(matches!(
        read("session/compact", json!({"session_id": "s1"})),
        SessionRequest::Compact {}
    ));
    assert!(matches!(
        read("turn/interrupt", json!({"session_id": "s1"})),
        SessionRequest::Interrupt {}
    ));
    assert!(matches!(
        read(
            "session/revert",
            json!({"session_id": "s1", "turn_id": "t1", "dry_run": true}),
        ),
        SessionRequest::Revert(RevertTo { turn_id, dry_run: true, force: false }) if turn_id == "t1"
    ));
    let start = read(
        "turn/start",
        json!({
            "session_id": "s1",
            "input": [{"kind": "text", "text": "a"}, {"kind": "text", "text": "b"}],
            "model": "local/m",
            "_meta": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        }),
    );
    assert!(matches!(
        &start,
        SessionRequest::StartTurn { input, turn_id: None, model: Some(model), reasoning_effort: None, .. }
            if input.text == "a\nb" && input.images.is_empty() && model == "local/m"
    ));
    assert_eq!(
        start.traceparent(),
        Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    );
    assert!(matches!(
        read(
            "turn/steer",
            json!({"session_id": "s1", "turn_id": "t1", "input": [{"kind": "text", "text": "more"}]}),
        ),
        SessionRequest::Steer { turn_id, input } if turn_id == "t1" && input == "more"
    ));
    assert!(matches!(
        read(
            "user_input/respond",
            json!({"session_id": "s1", "request_id": "r1", "answers": {"q": "a"}}),
        ),
        SessionRequest::RespondUserInput { request_id, answers }
            if request_id == "r1" && answers == json!({"q": "a"})
    ));
    assert!(matches!(
        read(
            "approval/respond",
            json!({"session_id": "s1", "approval_id": "a1", "decision": "accept_for_session"}),
        ),
        SessionRequest::RespondApproval { approval_id, decision: Decision::AcceptForSession, message: None }
            if approval_id == "a1"
    ));
}

#[test]
fn a_client_names_no_call_id_and_cannot_reach_a_nodes_methods() {
    assert!(matches!(
        session_request(
            "tool/invoke",
            json!({"session_id": "s1", "name": "read", "tool_call_id": "call_mine"}),
        ),
        SessionRequest::InvokeTool {
            tool_call_id: None,
            ..
        }
    ));
    for method in ["node/describe", "node/set_model", "node/cancel_task"] {
        for params in [
            json!({"session_id": "s1"}),
            json!({}),
            json!({"task_id": 5}),
        ] {
            assert!(
                matches!(Request::read(method, params.clone()), Ok(Request::Unknown)),
                "{method} {params}"
            );
        }
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
        json!({"session_id": "s1"}),
    ] {
        for method in ["no/such", "", "Session/Open", "session/open ", "Tool/List"] {
            assert!(
                matches!(Request::read(method, params.clone()), Ok(Request::Unknown)),
                "{method:?} {params}"
            );
        }
    }
}

#[test]
fn params_errors_read_as_reading_the_params_alone() {
    let error = params_error::<SessionParams>("task/list", json!({}));
    assert_eq!(
        error,
        json!({"code": -32602, "message": "missing field `session_id`", "data": {"kind": "invalid_params"}})
    );
    params_error::<SessionParams>("task/list", Value::Null);
    params_error::<SessionParams>("session/discard", json!({"session_id": 5}));
    params_error::<OpenParams>("session/open", json!({"after_seq": "3"}));
    params_error::<OpenParams>("session/open", json!({"after_seq": 1.5}));
    params_error::<TaskParams>("task/cancel", json!({"session_id": "s1"}));
    params_error::<TaskParams>(
        "task/output/read",
        json!({"session_id": "s1", "task_id": "t1", "lines": "3"}),
    );
    params_error::<TaskParams>(
        "task/output/read",
        json!({"session_id": "s1", "task_id": "t1", "lines": -1}),
    );
    // A session's method: the session first, then the request's own fields.
    assert_eq!(
        refused_with("tool/list", json!({})),
        "missing field `session_id`"
    );
    assert_eq!(
        refused_with("turn/interrupt", json!({"session_id": 5})),
        "invalid type: integer `5`, expected a string"
    );
    assert!(refused_with("tool/list", json!("s1")).starts_with("invalid type: string"));
    assert_eq!(
        refused_with("tool/invoke", json!({"session_id": "s1"})),
        "missing field `name`"
    );
    assert_eq!(
        refused_with("turn/start", json!({"session_id": "s1"})),
        "missing field `input`"
    );
    assert_eq!(
        refused_with(
            "turn/start",
            json!({"session_id": "s1", "input": [{"kind": "video"}]}),
        ),
        "unknown variant `video`, expected `text` or `image`"
    );
    assert!(
        refused_with("turn/start", json!({"session_id": "s1", "input": "hi"}))
            .starts_with("invalid type: string \"hi\", expected a sequence")
    );
    assert_eq!(
        refused_with(
            "user_input/respond",
            json!({"session_id": "s1", "request_id": "r1"}),
        ),
        "missing field `answers`"
    );
    assert!(
        refused_with(
            "session/revert",
            json!({"session_id": "s1", "turn_id": "t1", "dry_runn": true}),
        )
        .starts_with("unknown field `dry_runn`")
    );
    assert!(
        refused_with(
            "approval/respond",
            json!({"session_id": "s1", "approval_id": "a1", "decision": "maybe"}),
        )
        .starts_with("unknown variant `maybe`")
    );
}

#[test]
fn params_by_position_are_the_connections_alone() {
    // A derived struct also takes an array, by position, and ignores members it does not know.
    assert!(matches!(
        Request::read("task/list", json!(["s1"])),
        Ok(Request::Connection(ConnectionRequest::TaskList(SessionParams { session_id }))) if session_id == "s1"
    ));
    assert!(matches!(
        Request::read("tool/list", json!({"session_id": "s1", "method": "x", "params": 1})),
        Ok(Request::Session { session_id, request: SessionRequest::ToolList {} }) if session_id == "s1"
    ));
    // A session's method names its params.
    assert_eq!(
        refused_with("tool/invoke", json!(["s1", "read"])),
        "a session method takes its params by name, in an object"
    );
}

#[test]
fn a_turns_input_is_checked_as_it_is_read() {
    assert_eq!(
        refused_with("turn/start", json!({"session_id": "s1", "input": []})),
        "input needs at least one {kind: \"text\", text} or {kind: \"image\"} item"
    );
    assert_eq!(
        refused_with(
            "turn/start",
            json!({"session_id": "s1", "input": [{"kind": "image", "path": "a.png", "mime": "image/png"}]}),
        ),
        "input image 0: give either {mime, data} (base64) or {path} (relative to the workspace)"
    );
    let many: Vec<Value> = (0..=crate::session::MAX_INPUT_IMAGES)
        .map(|i| json!({"kind": "image", "path": format!("{i}.png")}))
        .collect();
    assert_eq!(
        refused_with("turn/start", json!({"session_id": "s1", "input": many})),
        format!(
            "input has {} images; at most {} are taken",
            crate::session::MAX_INPUT_IMAGES + 1,
            crate::session::MAX_INPUT_IMAGES
        )
    );
    assert_eq!(
        refused_with(
            "turn/steer",
            json!({"session_id": "s1", "turn_id": "t1", "input": [{"kind": "image", "path": "a.png"}]}),
        ),
        "turn/steer takes text items only; send images with turn/start"
    );
    assert_eq!(
        refused_with(
            "turn/steer",
            json!({"session_id": "s1", "turn_id": "t1", "input": []}),
        ),
        "input needs at least one {kind: \"text\", text} item"
    );
    // REST turns read the same input with the same words, and name the field for serde's.
    use crate::session::TurnInput;
    assert_eq!(
        TurnInput::from_json(json!([])).unwrap_err().to_string(),
        "input needs at least one {kind: \"text\", text} or {kind: \"image\"} item"
    );
    assert!(
        TurnInput::from_json(json!("hi"))
            .unwrap_err()
            .to_string()
            .starts_with("input: invalid type")
    );
}
