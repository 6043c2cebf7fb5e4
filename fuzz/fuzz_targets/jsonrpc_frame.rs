//! The WebSocket's JSON-RPC frame reader, up to the session: any text is read as a request or
//! refused with a well-formed JSON-RPC error answer; nothing is both, and a request with an id
//! always gets one or the other.
#![no_main]

use agentd::http::ws::frame::Frame;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let frame = Frame::decode(text);
    let refusal = frame.refusal();
    if frame.method().is_some() {
        assert!(refusal.is_none(), "a request is not also refused");
    }
    if let Some(answer) = &refusal {
        let answer: Value = serde_json::from_str(answer).expect("the answer is JSON");
        assert_eq!(answer["jsonrpc"], "2.0");
        let code = answer["error"]["code"].as_i64().expect("an integer code");
        assert!(
            [-32700, -32600, -32601, -32602].contains(&code),
            "{code} for {text:?}"
        );
        assert!(answer["error"]["data"]["kind"].is_string());
        assert!(answer.get("result").is_none());
        // A string id is echoed exactly.
        if let Ok(Value::Object(request)) = serde_json::from_str::<Value>(text)
            && let Some(Value::String(id)) = request.get("id")
            && frame.has_id()
        {
            assert_eq!(answer["id"], id.as_str());
        }
    }
    // A request that names a method and has an id is carried out or answered.
    if frame.has_id() {
        assert!(frame.method().is_some() || refusal.is_some(), "{text:?}");
    }
});
