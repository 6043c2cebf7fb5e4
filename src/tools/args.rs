//! Argument safety for tool calls: an exact allocation-free JSON size, per-tool schema
//! validation, and the capped copy of the arguments that events record.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::sync::{Arc, Weak};

use jsonschema::ValidationError;
use serde_json::{Number, Value, json};

/// Default cap on a tool call's serialised arguments.
pub const DEFAULT_MAX_ARGS_BYTES: usize = 1_048_576;

/// Longest error message passed back to the model; jsonschema messages may embed whole instances.
const MAX_MESSAGE_BYTES: usize = 300;

/// Exact length in bytes of `serde_json::to_vec(value)`, computed without allocating.
pub fn estimate_json_size(value: &Value) -> usize {
    let mut remaining = usize::MAX;
    match walk(value, &mut remaining) {
        Some(()) => usize::MAX - remaining,
        // Only a value larger than the address space could exhaust this budget.
        None => usize::MAX,
    }
}

/// Largest `arguments` a `tool/started` event carries, and so stores: every call's arguments
/// (up to `tools.max_args_bytes`) would otherwise be kept for ever in the event log and sent
/// again on every replay. The call itself always runs with the whole arguments.
pub const EVENT_ARGS_BYTES: usize = 64 * 1024;

/// What the marker's members besides `preview`'s text take at most: the braces, four keys,
/// two 20-digit numbers, `true` and the preview's quotes come to about 110 bytes.
const MARKER_OVERHEAD: usize = 256;

/// `arguments` as a `tool/started` event records them: unchanged when their JSON takes at most
/// [`EVENT_ARGS_BYTES`], else the marker `{"truncated": true, "original_bytes": N,
/// "omitted_bytes": M, "preview": P}`, where `P` is the first `N - M` bytes of the arguments'
/// compact JSON text (cut at a character boundary) and the marker's own JSON fits the cap too.
pub fn arguments_for_event(arguments: &Value) -> Value {
    if !json_size_exceeds(arguments, EVENT_ARGS_BYTES) {
        return arguments.clone();
    }
    let text = arguments.to_string();
    // The preview is written as a JSON string, so each character costs its escaped length.
    let budget = EVENT_ARGS_BYTES - MARKER_OVERHEAD;
    let (mut end, mut spent) = (0, 0);
    for (at, c) in text.char_indices() {
        let cost = match c {
            '"' | '\\' | '\u{8}' | '\t' | '\n' | '\u{c}' | '\r' => 2,
            c if u32::from(c) < 0x20 => 6,
            c => c.len_utf8(),
        };
        if spent + cost > budget {
            break;
        }
        spent += cost;
        end = at + c.len_utf8();
    }
    json!({
        "truncated": true,
        "original_bytes": text.len(),
        "omitted_bytes": text.len() - end,
        "preview": &text[..end],
    })
}

/// Whether `value` serialises to more than `limit` bytes; stops walking as soon as it knows.
pub fn json_size_exceeds(value: &Value, limit: usize) -> bool {
    let mut remaining = limit;
    walk(value, &mut remaining).is_none()
}

/// Spends `n` bytes of the budget, or yields `None` once the budget cannot cover them.
fn take(remaining: &mut usize, n: usize) -> Option<()> {
    *remaining = remaining.checked_sub(n)?;
    Some(())
}

// Recursion depth is bounded because arguments come from serde_json's parser, which refuses
// documents nested deeper than 128 levels.
fn walk(value: &Value, remaining: &mut usize) -> Option<()> {
    match value {
        Value::Null | Value::Bool(true) => take(remaining, 4),
        Value::Bool(false) => take(remaining, 5),
        Value::Number(n) => take(remaining, number_len(n)),
        Value::String(s) => take_str(s, remaining),
        Value::Array(items) => {
            take(remaining, 2 + items.len().saturating_sub(1))?;
            items.iter().try_for_each(|item| walk(item, remaining))
        }
        Value::Object(map) => {
            // Braces, one colon per entry, and commas between entries.
            take(remaining, 2 + map.len() + map.len().saturating_sub(1))?;
            map.iter().try_for_each(|(key, item)| {
                take_str(key, remaining).and_then(|()| walk(item, remaining))
            })
        }
    }
}

/// Mirrors serde_json's `ESCAPE` table: short escapes cost 2 bytes, other controls `\u00XX` 6.
fn take_str(s: &str, remaining: &mut usize) -> Option<()> {
    // Escaping only lengthens a string, so the raw length is charged first as a lower bound.
    take(remaining, s.len().checked_add(2)?)?;
    take(remaining, escape_overhead(s.as_bytes()))
}

/// Extra bytes escaping adds: `"` and `\\` and the short controls (`\b \t \n \f \r`) one
/// each, every other control five (`\u00XX`).
///
/// One pass with three `u8` counters per chunk of at most 255 bytes, so no counter can wrap and
/// the compiler keeps all three in byte-wide vector lanes; `usize` counters would widen every
/// lane and run several times slower.
fn escape_overhead(bytes: &[u8]) -> usize {
    let (mut quotes, mut controls, mut short) = (0usize, 0usize, 0usize);
    for chunk in bytes.chunks(255) {
        let (mut q, mut c, mut s) = (0u8, 0u8, 0u8);
        for &b in chunk {
            q = q.wrapping_add(u8::from((b == b'"') | (b == b'\\')));
            c = c.wrapping_add(u8::from(b < 0x20));
            // 0x08..=0x0d minus 0x0b (vertical tab, which has no short form).
            s = s.wrapping_add(u8::from((b.wrapping_sub(0x08) < 6) & (b != 0x0b)));
        }
        quotes += usize::from(q);
        controls += usize::from(c);
        short += usize::from(s);
    }
    quotes + controls + 4 * (controls - short)
}

// Assumes serde_json without `arbitrary_precision`, where a `Number` is always a u64, i64 or f64.
fn number_len(n: &Number) -> usize {
    if let Some(u) = n.as_u64() {
        digits(u)
    } else if let Some(i) = n.as_i64() {
        digits(i.unsigned_abs()) + usize::from(i < 0)
    } else {
        n.as_f64().map_or(4, float_len)
    }
}

fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |log| log as usize + 1)
}

/// Same formatter and stack buffer serde_json uses, so the length matches byte for byte.
fn float_len(f: f64) -> usize {
    if f.is_finite() {
        zmij::Buffer::new().format_finite(f).len()
    } else {
        // serde_json writes non-finite floats as `null`.
        4
    }
}

/// A tool's input schema, compiled once and reused for every call.
#[derive(Debug, Clone)]
pub struct ArgsValidator {
    validator: jsonschema::Validator,
}

// Validators are shared behind `Arc` across worker threads.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ArgsValidator>();
};

/// Validators by the JSON text of the schema they were compiled from, shared by a registry and
/// every snapshot of it: a schema seen before is not compiled again (an MCP server's tools
/// listed again, a session's own server bringing the tools the last session's did, the
/// deferral tool listed anew). Held weakly: a validator no tool uses any more is dropped.
#[derive(Debug, Default)]
pub struct CompiledSchemas(std::sync::Mutex<HashMap<String, Weak<ArgsValidator>>>);

impl CompiledSchemas {
    /// The validator of `schema`, compiled now only if no live one was compiled from the
    /// same text.
    pub fn compile(&self, schema: &Value) -> Result<Arc<ArgsValidator>, SchemaError> {
        let key = schema.to_string();
        if let Some(known) = crate::mutex::lock(&self.0)
            .get(&key)
            .and_then(Weak::upgrade)
        {
            return Ok(known);
        }
        // Compiled outside the lock: other registries' lookups need not wait for it.
        let compiled = Arc::new(ArgsValidator::compile(schema)?);
        let mut known = crate::mutex::lock(&self.0);
        known.retain(|_, validator| validator.strong_count() > 0);
        known.insert(key, Arc::downgrade(&compiled));
        Ok(compiled)
    }

    /// How many schemas it knows, live or not swept yet.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        crate::mutex::lock(&self.0).len()
    }
}

/// A schema that is not valid JSON Schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid tool input schema: {message}")]
pub struct SchemaError {
    /// Why the schema was rejected, including where in the schema when known.
    pub message: String,
}

/// Arguments that do not satisfy the tool's schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid arguments at {}: {message}", describe_path(path))]
pub struct InvalidArguments {
    /// JSON pointer to the offending value, `""` for the top level.
    pub path: String,
    /// What is wrong there, plus how many further errors exist.
    pub message: String,
}

impl ArgsValidator {
    /// Compiles `schema`, checking it against its meta-schema.
    pub fn compile(schema: &Value) -> Result<Self, SchemaError> {
        match jsonschema::validator_for(schema) {
            Ok(validator) => Ok(Self { validator }),
            Err(err) => {
                let mut message = describe(&err);
                let path = err.instance_path().as_str();
                if !path.is_empty() {
                    message.push_str(" (at ");
                    message.push_str(path);
                    message.push(')');
                }
                Err(SchemaError { message })
            }
        }
    }

    /// Checks arguments; the error names the failing path (JSON pointer) and what is wrong.
    pub fn validate(&self, args: &Value) -> Result<(), InvalidArguments> {
        let mut errors = self.validator.iter_errors(args);
        let Some(first) = errors.next() else {
            return Ok(());
        };
        let mut message = describe(&first);
        let more = errors.count();
        if more > 0 {
            // The model sees one error per round trip; telling it there are more avoids a retry loop.
            let _ = write!(message, " (and {more} more)");
        }
        Err(InvalidArguments {
            path: first.instance_path().as_str().to_owned(),
            message,
        })
    }
}

fn describe_path(path: &str) -> &str {
    if path.is_empty() {
        "the top level"
    } else {
        path
    }
}

/// Describes `err` within the cap; an oversized embedded instance is shortened, not the verdict.
fn describe(err: &ValidationError<'_>) -> String {
    let (text, truncated) = capped(err, MAX_MESSAGE_BYTES);
    if !truncated {
        return text;
    }
    let (preview, _) = capped(err.instance(), MAX_MESSAGE_BYTES / 3);
    capped(&err.masked_with(preview), MAX_MESSAGE_BYTES).0
}

/// Renders `item` up to `cap` bytes plus an ellipsis, never formatting past the cap.
fn capped(item: &impl fmt::Display, cap: usize) -> (String, bool) {
    let mut out = CappedWriter {
        text: String::new(),
        cap,
    };
    let truncated = write!(out, "{item}").is_err();
    if truncated {
        out.text.push('…');
    }
    (out.text, truncated)
}

struct CappedWriter {
    text: String,
    cap: usize,
}

impl fmt::Write for CappedWriter {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.cap.saturating_sub(self.text.len());
        if s.len() <= room {
            self.text.push_str(s);
            return Ok(());
        }
        self.text.push_str(&s[..s.floor_char_boundary(room)]);
        // Failing the write aborts the rest of the formatting, so a huge value is never rendered.
        Err(fmt::Error)
    }
}

/// Decodes a tool's arguments into its typed form; a mismatch is the model's to fix.
pub fn parse_args<T: serde::de::DeserializeOwned>(
    tool: &str,
    args: &Value,
) -> Result<T, super::ToolError> {
    T::deserialize(args).map_err(|err| {
        super::ToolError::model("invalid_input", format!("{tool}: invalid arguments: {err}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    #[test]
    fn event_arguments_keep_small_ones_and_mark_large_ones() {
        let small = json!({"path": "a.txt", "content": "x".repeat(1000)});
        assert_eq!(arguments_for_event(&small), small);
        let exact = json!("y".repeat(EVENT_ARGS_BYTES - 2));
        assert_eq!(
            arguments_for_event(&exact),
            exact,
            "exactly the cap is kept"
        );
        // Plain text, escape-heavy text and multi-byte characters.
        for filler in ["z", "\"\\", "\u{1}", "é", "🦀"] {
            let large = json!({"content": filler.repeat(200_000)});
            let full = large.to_string();
            let marker = arguments_for_event(&large);
            assert!(
                serde_len(&marker) <= EVENT_ARGS_BYTES,
                "{filler:?}: fits the cap"
            );
            assert_eq!(marker["truncated"], true);
            assert_eq!(marker["original_bytes"], full.len());
            let preview = marker["preview"].as_str().unwrap();
            assert!(full.starts_with(preview), "{filler:?}: a prefix");
            assert!(
                preview.len() > EVENT_ARGS_BYTES / 8,
                "{filler:?}: not starved"
            );
            assert_eq!(
                marker["omitted_bytes"].as_u64().unwrap() as usize,
                full.len() - preview.len()
            );
        }
    }

    fn serde_len(v: &Value) -> usize {
        serde_json::to_vec(v).unwrap().len()
    }

    fn assert_exact(v: &Value) {
        let len = serde_len(v);
        assert_eq!(estimate_json_size(v), len, "size of {v}");
        assert!(!json_size_exceeds(v, len), "{v} fits in {len}");
        assert!(json_size_exceeds(v, len - 1), "{v} exceeds {}", len - 1);
    }

    #[test]
    fn strings_match_serde_json() {
        let samples = ["", "plain", "\"", "\\", "/", "\u{7f}", "a\"b\\c"];
        for s in samples.into_iter().chain(["é", "日本語", "🦀"]) {
            assert_exact(&json!(s));
        }
        for byte in 0u8..0x20 {
            assert_exact(&json!(char::from(byte).to_string()));
        }
        assert_eq!(estimate_json_size(&json!("\u{1}\n")), 2 + 6 + 2);
    }

    #[test]
    fn scalars_match_serde_json() {
        for v in [json!(null), json!(true), json!(false), json!(u64::MAX)] {
            assert_exact(&v);
        }
        for i in [0, 7, -1, 9, 10, -10, 99, i64::MIN, i64::MAX] {
            assert_exact(&json!(i));
        }
        for f in [0.0, -0.0, 1.0, 0.1, 1e300, -1e300, 5e-324, f64::MAX, 1.5e-7] {
            assert_exact(&json!(f));
        }
        assert_eq!(float_len(f64::NAN), 4);
    }

    #[test]
    fn containers_match_serde_json() {
        let cases = [
            json!([]),
            json!({}),
            json!([[], [{}, {}]]),
            json!({"": ""}),
            json!({"a\n": [1, -2, 3.5, null, {"b\"": {"c": []}}]}),
            json!([[[[["deep", {"k": "\u{0}"}]]]]]),
        ];
        cases.iter().for_each(assert_exact);
    }

    fn arb_string() -> impl Strategy<Value = String> {
        let ch = prop_oneof![(0u8..0x80).prop_map(char::from), any::<char>()];
        prop::collection::vec(ch, 0..12).prop_map(|chars| chars.into_iter().collect())
    }

    fn arb_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
            arb_string().prop_map(Value::String),
        ];
        leaf.prop_recursive(5, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                prop::collection::vec((arb_string(), inner), 0..8)
                    .prop_map(|entries| Value::Object(entries.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn size_matches_serde_json(v in arb_value()) {
            let len = serde_len(&v);
            prop_assert_eq!(estimate_json_size(&v), len);
            for n in len.saturating_sub(3)..=len + 3 {
                prop_assert_eq!(json_size_exceeds(&v, n), len > n, "limit {}", n);
            }
        }
    }

    thread_local! {
        static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
    }

    /// Counts allocations per thread, so tests running in parallel do not disturb each other.
    struct CountingAlloc;

    fn count_allocation() {
        // `try_with` because allocations can happen while a thread's locals are torn down.
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
    }

    // SAFETY: every call is forwarded unchanged to `System`.
    unsafe impl GlobalAlloc for CountingAlloc {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            count_allocation();
            unsafe { System.alloc(layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            count_allocation();
            unsafe { System.alloc_zeroed(layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            count_allocation();
            unsafe { System.realloc(ptr, layout, new_size) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    #[global_allocator]
    static GLOBAL: CountingAlloc = CountingAlloc;

    fn allocations() -> usize {
        ALLOCATIONS.with(Cell::get)
    }

    #[test]
    fn sizing_never_allocates() {
        let rows: Vec<Value> = (0..6_000i64)
            .map(|i| {
                json!({
                    "id": i * -7_919,
                    "big": u64::MAX - i as u64,
                    "ratio": i as f64 / 7.0,
                    "tiny": 5e-324 * i as f64,
                    "text": format!("line {i}\n\t\"quoted\" \\ \u{1}\u{1f} é 🦀"),
                    "flags": [true, false, null],
                })
            })
            .collect();
        let value = Value::Array(rows);
        let len = serde_len(&value);
        assert!((900_000..1_200_000).contains(&len), "{len} bytes");

        let before = allocations();
        drop(std::hint::black_box(vec![0u8; 16]));
        assert_eq!(allocations(), before + 1, "counter is live");

        let before = allocations();
        let size = estimate_json_size(&value);
        let over = json_size_exceeds(&value, len - 1);
        let within = json_size_exceeds(&value, len);
        let capped = json_size_exceeds(&value, DEFAULT_MAX_ARGS_BYTES / 2);
        assert_eq!(allocations(), before, "sizing allocated");
        assert_eq!((size, over, within, capped), (len, true, false, true));
    }

    fn items_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "items": {"type": "array", "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}},
                }},
            },
            "required": ["path"],
        })
    }

    fn check(args: Value) -> Result<(), InvalidArguments> {
        ArgsValidator::compile(&items_schema())
            .unwrap()
            .validate(&args)
    }

    #[test]
    fn missing_required_property_is_reported_at_the_top_level() {
        let err = check(json!({})).unwrap_err();
        assert_eq!(err.path, "");
        let expected = r#"invalid arguments at the top level: "path" is a required property"#;
        assert_eq!(err.to_string(), expected);
    }

    #[test]
    fn nested_type_error_names_its_pointer() {
        let err = check(json!({"path": "a", "items": [{"name": "x"}, {"name": 5}]})).unwrap_err();
        assert_eq!(err.path, "/items/1/name");
        let expected = r#"invalid arguments at /items/1/name: 5 is not of type "string""#;
        assert_eq!(err.to_string(), expected);
    }

    #[test]
    fn valid_arguments_pass() {
        assert_eq!(
            check(json!({"path": "a", "items": [{"name": "x"}, {}]})),
            Ok(())
        );
    }

    #[test]
    fn further_errors_are_counted() {
        let err = check(json!({"items": [{"name": 1}]})).unwrap_err();
        assert!(err.message.ends_with(" (and 1 more)"), "{err}");
    }

    #[test]
    fn huge_instances_are_not_echoed() {
        let validator = ArgsValidator::compile(&json!({"type": "string"})).unwrap();
        let err = validator
            .validate(&json!(vec!["x".repeat(100); 100]))
            .unwrap_err();
        let message = err.message;
        assert!(
            message.len() <= MAX_MESSAGE_BYTES + '…'.len_utf8(),
            "{message}"
        );
        assert!(message.starts_with(r#"["xxx"#), "{message}");
        assert!(
            message.ends_with(r#"… is not of type "string""#),
            "{message}"
        );
    }

    #[test]
    fn invalid_schema_is_rejected() {
        let err = ArgsValidator::compile(&json!({"type": 12})).unwrap_err();
        assert!(err.message.contains("12"), "{err}");
        assert!(
            err.to_string().starts_with("invalid tool input schema: "),
            "{err}"
        );
    }
}
