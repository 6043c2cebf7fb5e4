//! The argument size estimate: exactly `serde_json::to_vec(v).len()` for any JSON document,
//! any string and any finite float, and the cap check agrees with it at every limit.
#![no_main]

use agentd::tools::args::{estimate_json_size, json_size_exceeds};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fn check(value: &Value, limit: usize) {
    let exact = serde_json::to_vec(value).unwrap().len();
    assert_eq!(estimate_json_size(value), exact, "{value}");
    assert_eq!(json_size_exceeds(value, limit), exact > limit, "{value} at {limit}");
    assert!(!json_size_exceeds(value, exact));
    if exact > 0 {
        assert!(json_size_exceeds(value, exact - 1));
    }
}

fuzz_target!(|data: &[u8]| {
    let limit = data.iter().take(3).fold(0usize, |n, &b| n * 256 + usize::from(b));
    if let Ok(value) = serde_json::from_slice::<Value>(data) {
        check(&value, limit);
    }
    check(&Value::String(String::from_utf8_lossy(data).into_owned()), limit);
    for word in data.chunks_exact(8) {
        let float = f64::from_bits(u64::from_le_bytes(word.try_into().unwrap()));
        if let Some(number) = serde_json::Number::from_f64(float) {
            check(&Value::Number(number), limit);
        }
        let integer = i64::from_le_bytes(word.try_into().unwrap());
        check(&Value::from(integer), limit);
        check(&Value::from(integer as u64), limit);
    }
});
