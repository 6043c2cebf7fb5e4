//! `diff_edit`: the unified diff parser on any text, and the applier checked against a second
//! implementation: a diff that `similar` writes from A to B, parsed and applied to A, gives B.
#![no_main]

use agentd::builtin::diff_edit::{apply_to_bytes, parse_unified_diff};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // Any text: the parser never panics, and what it reads applies or is refused.
    if let Ok(diff) = parse_unified_diff(text) {
        let _ = apply_to_bytes(b"one\ntwo\nthree\n", &diff);
        let _ = apply_to_bytes(text.as_bytes(), &diff);
    }
    // Split at the first NUL into a file before and after; CR is left out, since a line's
    // ending is the file's and a diff's lines cannot say which ending they had.
    let Some((before, after)) = text.split_once('\0') else {
        return;
    };
    if before.contains('\r') || after.contains('\r') || before == after {
        return;
    }
    let written = similar::TextDiff::from_lines(before, after)
        .unified_diff()
        .context_radius(3)
        .header("a/f", "b/f")
        .to_string();
    let diff = parse_unified_diff(&written)
        .unwrap_or_else(|err| panic!("similar's diff does not parse: {err}\n{written}"));
    let applied = apply_to_bytes(before.as_bytes(), &diff)
        .unwrap_or_else(|err| panic!("similar's diff does not apply: {err}\n{written}"));
    assert_eq!(
        String::from_utf8_lossy(&applied),
        after,
        "applying\n{written}"
    );
});
