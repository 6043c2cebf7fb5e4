//! `apply_patch`: the parser on any text, and every Update it yields applied to an in-memory
//! tree. An updated file always ends with a newline (Codex's rule), and a hunk of context only
//! changes nothing but that.
#![no_main]

use std::collections::BTreeMap;

use agentd::builtin::patch::{FileOp, HunkLine, apply_update, parse_patch};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Before the first NUL: the text every file of the tree starts with; after it: the patch.
    let (seed, patch) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (&b"alpha\nbeta\ngamma\n"[..], data),
    };
    let Ok(text) = std::str::from_utf8(patch) else {
        return;
    };
    let Ok(parsed) = parse_patch(text) else {
        return;
    };
    let mut tree: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for op in &parsed.ops {
        match op {
            FileOp::Add { path, contents } => {
                assert!(contents.is_empty() || contents.ends_with('\n'), "{contents:?}");
                tree.insert(path.clone(), contents.clone().into_bytes());
            }
            FileOp::Delete { path } => {
                tree.remove(path);
            }
            FileOp::Update {
                path,
                move_to,
                hunks,
            } => {
                let before = tree.get(path).cloned().unwrap_or_else(|| seed.to_vec());
                let Ok(after) = apply_update(&before, hunks) else {
                    continue;
                };
                if !hunks.is_empty() {
                    assert!(
                        after.is_empty() || after.ends_with(b"\n"),
                        "an updated file ends with a newline: {after:?}"
                    );
                }
                let context_only = hunks.iter().all(|hunk| {
                    hunk.lines
                        .iter()
                        .all(|line| matches!(line, HunkLine::Context(_)))
                });
                if context_only {
                    let tail = after
                        .strip_prefix(&before[..])
                        .unwrap_or_else(|| panic!("{before:?} became {after:?}"));
                    assert!(
                        matches!(tail, b"" | b"\n" | b"\r\n"),
                        "{before:?} became {after:?}"
                    );
                }
                tree.remove(path);
                tree.insert(move_to.clone().unwrap_or_else(|| path.clone()), after);
            }
        }
    }
});
