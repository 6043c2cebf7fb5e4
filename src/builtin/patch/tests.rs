//! Tests of `apply_patch` through the tool: every grammar form, the results, the refusals and
//! the rollback of a write that fails part-way.

use std::fs;
use std::path::PathBuf;

use super::apply::{Step, failure_result, run_steps};
use super::*;
use crate::tools::ConcurrencyClass;

fn workspace(files: &[(&str, &str)]) -> (tempfile::TempDir, Arc<Workspace>) {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let full = dir.path().join(path);
        fs::create_dir_all(full.parent().unwrap()).unwrap();
        fs::write(full, text).unwrap();
    }
    let ws = Workspace::new(dir.path());
    (dir, ws)
}

fn wrap(body: &str) -> String {
    format!("*** Begin Patch\n{body}\n*** End Patch\n")
}

async fn run(ws: &Arc<Workspace>, input: &str) -> Result<ToolResult, ToolError> {
    ApplyPatch::new(Arc::clone(ws))
        .call(&ToolContext::detached("."), &json!({ "input": input }))
        .await
}

fn read(dir: &tempfile::TempDir, path: &str) -> Option<String> {
    fs::read_to_string(dir.path().join(path)).ok()
}

fn message(err: ToolError) -> (&'static str, String) {
    match err {
        ToolError::Model { kind, message } => (kind, message),
        other => panic!("expected a model error, got {other:?}"),
    }
}

struct Case {
    name: &'static str,
    files: &'static [(&'static str, &'static str)],
    body: &'static str,
    expect: &'static [(&'static str, Option<&'static str>)],
}

const CASES: &[Case] = &[
    Case {
        name: "add creates parents; a lone '+' is an empty line",
        files: &[],
        body: "*** Add File: dir/new.txt\n+hello\n+\n+world",
        expect: &[("dir/new.txt", Some("hello\n\nworld\n"))],
    },
    Case {
        name: "add an empty file",
        files: &[],
        body: "*** Add File: empty.txt",
        expect: &[("empty.txt", Some(""))],
    },
    Case {
        name: "delete",
        files: &[("old.txt", "bye\n")],
        body: "*** Delete File: old.txt",
        expect: &[("old.txt", None)],
    },
    Case {
        name: "update whose first hunk has no @@",
        files: &[("a.txt", "one\ntwo\nthree\n")],
        body: "*** Update File: a.txt\n one\n-two\n+TWO\n three",
        expect: &[("a.txt", Some("one\nTWO\nthree\n"))],
    },
    Case {
        name: "update with a bare @@",
        files: &[("a.txt", "one\ntwo\nthree\n")],
        body: "*** Update File: a.txt\n@@\n one\n-two\n+TWO\n three",
        expect: &[("a.txt", Some("one\nTWO\nthree\n"))],
    },
    Case {
        name: "two hunks in order",
        files: &[("a.txt", "a\nb\nc\nd\ne\nf\ng\n")],
        body: "*** Update File: a.txt\n@@\n a\n-b\n+B\n@@\n f\n-g\n+G",
        expect: &[("a.txt", Some("a\nB\nc\nd\ne\nf\nG\n"))],
    },
    Case {
        name: "an anchor picks the second of two identical blocks",
        files: &[(
            "a.rs",
            "fn one() {\n    x = 1;\n}\nfn two() {\n    x = 1;\n}\n",
        )],
        body: "*** Update File: a.rs\n@@ fn two() {\n-    x = 1;\n+    x = 2;",
        expect: &[(
            "a.rs",
            Some("fn one() {\n    x = 1;\n}\nfn two() {\n    x = 2;\n}\n"),
        )],
    },
    Case {
        name: "stacked anchors are found one after another",
        files: &[(
            "a.py",
            "class A:\n    def f(self):\n        return 1\nclass B:\n    def g(self):\n        \
             return 1\n    def f(self):\n        return 1\n",
        )],
        body: "*** Update File: a.py\n@@ class B:\n@@     def f(self):\n-        return 1\n+        \
               return 2",
        expect: &[(
            "a.py",
            Some(
                "class A:\n    def f(self):\n        return 1\nclass B:\n    def g(self):\n        \
                 return 1\n    def f(self):\n        return 2\n",
            ),
        )],
    },
    Case {
        name: "End of File matches the last occurrence",
        files: &[("a.txt", "x\nmid\nx\n")],
        body: "*** Update File: a.txt\n@@\n-x\n+y\n*** End of File",
        expect: &[("a.txt", Some("x\nmid\ny\n"))],
    },
    Case {
        name: "move and update",
        files: &[("old/name.txt", "keep\nchange\n")],
        body: "*** Update File: old/name.txt\n*** Move to: new/name.txt\n@@\n keep\n-change\n+changed",
        expect: &[
            ("old/name.txt", None),
            ("new/name.txt", Some("keep\nchanged\n")),
        ],
    },
    Case {
        name: "move only",
        files: &[("a.txt", "same\n")],
        body: "*** Update File: a.txt\n*** Move to: b.txt",
        expect: &[("a.txt", None), ("b.txt", Some("same\n"))],
    },
    Case {
        name: "matching ignores trailing whitespace when exact fails",
        files: &[("a.txt", "alpha   \nbeta\n")],
        body: "*** Update File: a.txt\n@@\n-alpha\n+ALPHA",
        expect: &[("a.txt", Some("ALPHA\nbeta\n"))],
    },
    Case {
        name: "context lines keep the file's text under fuzzy matching",
        files: &[("a.txt", "ctx  \nold\n")],
        body: "*** Update File: a.txt\n ctx\n-old\n+new",
        expect: &[("a.txt", Some("ctx  \nnew\n"))],
    },
    Case {
        name: "matching ignores surrounding whitespace as the last resort",
        files: &[("a.txt", "    indented\nnext\n")],
        body: "*** Update File: a.txt\n@@\n-indented\n+    INDENTED",
        expect: &[("a.txt", Some("    INDENTED\nnext\n"))],
    },
    Case {
        name: "an exact match later wins over a fuzzy one earlier",
        files: &[("a.txt", "foo \nfoo\n")],
        body: "*** Update File: a.txt\n@@\n-foo\n+bar",
        expect: &[("a.txt", Some("foo \nbar\n"))],
    },
    Case {
        name: "a blank line inside a hunk is empty context",
        files: &[("a.txt", "a\n\nb\n")],
        body: "*** Update File: a.txt\n a\n\n-b\n+B",
        expect: &[("a.txt", Some("a\n\nB\n"))],
    },
    Case {
        name: "blank lines after a hunk are spacing",
        files: &[("a.txt", "a\nb\n")],
        body: "*** Update File: a.txt\n@@\n-a\n+A\n\n",
        expect: &[("a.txt", Some("A\nb\n"))],
    },
    Case {
        name: "blank lines after End of File before the next file",
        files: &[("a.txt", "a\nb\n"), ("c.txt", "c\n")],
        body: "*** Update File: a.txt\n@@\n-b\n+B\n*** End of File\n\n*** Update File: \
               c.txt\n-c\n+C",
        expect: &[("a.txt", Some("a\nB\n")), ("c.txt", Some("C\n"))],
    },
    Case {
        name: "a pure addition goes right after its anchor",
        files: &[("a.rs", "fn main() {\n}\n")],
        body: "*** Update File: a.rs\n@@ fn main() {\n+    run();",
        expect: &[("a.rs", Some("fn main() {\n    run();\n}\n"))],
    },
    Case {
        name: "a pure addition without anchor is appended",
        files: &[("a.txt", "a\n")],
        body: "*** Update File: a.txt\n@@\n+b",
        expect: &[("a.txt", Some("a\nb\n"))],
    },
    Case {
        name: "a unified-diff range after @@ is not an anchor",
        files: &[("a.txt", "a\nb\n")],
        body: "*** Update File: a.txt\n@@ -1,2 +1,2 @@\n-a\n+A\n b",
        expect: &[("a.txt", Some("A\nb\n"))],
    },
    Case {
        name: "delete then add the same path",
        files: &[("a.txt", "old\n")],
        body: "*** Delete File: a.txt\n*** Add File: a.txt\n+new",
        expect: &[("a.txt", Some("new\n"))],
    },
    Case {
        name: "CRLF file stays CRLF",
        files: &[("w.txt", "one\r\ntwo\r\nthree\r\n")],
        body: "*** Update File: w.txt\n@@\n one\n-two\n+TWO\n+2b\n three",
        expect: &[("w.txt", Some("one\r\nTWO\r\n2b\r\nthree\r\n"))],
    },
    Case {
        name: "no trailing newline: an updated file ends with one, as Codex's",
        files: &[("n.txt", "a\nb\nc")],
        body: "*** Update File: n.txt\n@@\n-b\n+B",
        expect: &[("n.txt", Some("a\nB\nc\n"))],
    },
    Case {
        name: "no trailing newline: replacing the last line ends with one (Codex scenario 014)",
        files: &[("n.txt", "a\nb")],
        body: "*** Update File: n.txt\n@@\n a\n-b\n+B",
        expect: &[("n.txt", Some("a\nB\n"))],
    },
    Case {
        name: "no trailing newline: adding after the last line ends with one",
        files: &[("n.txt", "a\nb")],
        body: "*** Update File: n.txt\n@@\n b\n+c",
        expect: &[("n.txt", Some("a\nb\nc\n"))],
    },
];

#[tokio::test]
async fn each_grammar_form_and_matching_strategy_applies() {
    for case in CASES {
        let (dir, ws) = workspace(case.files);
        let result = run(&ws, &wrap(case.body))
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        assert!(result.success, "{}: {}", case.name, result.output);
        for (path, want) in case.expect {
            assert_eq!(read(&dir, path).as_deref(), *want, "{}: {path}", case.name);
        }
        assert!(!ws.changes().is_empty(), "{}: journal", case.name);
        assert!(ws.changes().iter().all(|c| c.tool == TOOL), "{}", case.name);
    }
}

#[tokio::test]
async fn the_result_lists_every_change() {
    let (dir, ws) = workspace(&[
        ("edit.txt", "a\n"),
        ("gone.txt", "x\n"),
        ("from.txt", "m\n"),
    ]);
    let patch = wrap(
        "*** Add File: new.txt\n+n\n*** Update File: edit.txt\n-a\n+b\n*** Delete File: \
         gone.txt\n*** Update File: from.txt\n*** Move to: sub/to.txt\n@@\n-m\n+M",
    );
    let result = run(&ws, &patch).await.unwrap();
    assert!(result.success);
    assert_eq!(
        result.output,
        "Success. Updated the following files:\nA new.txt\nR from.txt -> sub/to.txt\nM \
         edit.txt\nD gone.txt\n"
    );
    assert_eq!(
        result.structured_metadata.unwrap(),
        json!({
            "added": ["new.txt"],
            "modified": ["edit.txt", "sub/to.txt"],
            "moved": [{"from": "from.txt", "to": "sub/to.txt"}],
            "deleted": ["gone.txt"],
        })
    );
    assert_eq!(result.file_modified, Some(PathBuf::from("new.txt")));
    assert_eq!(read(&dir, "sub/to.txt").as_deref(), Some("M\n"));
    let kinds: Vec<_> = ws.changes().into_iter().map(|c| (c.path, c.kind)).collect();
    use crate::tools::workspace::ChangeKind::*;
    assert_eq!(
        kinds,
        [
            ("new.txt".to_string(), Created),
            ("edit.txt".to_string(), Modified),
            ("gone.txt".to_string(), Deleted),
            ("from.txt".to_string(), Moved),
            ("sub/to.txt".to_string(), Modified),
        ]
    );
}

#[tokio::test]
async fn a_failing_hunk_in_the_second_file_changes_nothing() {
    let (dir, ws) = workspace(&[("one.txt", "1\n"), ("two.txt", "2\nkeep\n")]);
    let patch = wrap(
        "*** Add File: created.txt\n+x\n*** Update File: one.txt\n-1\n+ONE\n*** Update File: \
         two.txt\n@@\n-2\n+TWO\n@@\n keep\n-missing line\n+x",
    );
    let (kind, text) = message(run(&ws, &patch).await.unwrap_err());
    assert_eq!(kind, "no_match");
    for want in [
        "Update File `two.txt`",
        "hunk 2 (patch line 11) did not match",
        "  |keep\n  |missing line\n",
        "lines 2-2 match the first 1; then the file ends before `missing line`",
        "No file was changed.",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    assert_eq!(read(&dir, "one.txt").as_deref(), Some("1\n"));
    assert_eq!(read(&dir, "two.txt").as_deref(), Some("2\nkeep\n"));
    assert_eq!(read(&dir, "created.txt"), None);
    assert!(ws.changes().is_empty());
}

#[tokio::test]
async fn refusals_name_the_problem_and_change_nothing() {
    /// Name, files beforehand, patch body, error kind, texts the message must contain.
    type Refusal = (
        &'static str,
        Files,
        &'static str,
        &'static str,
        &'static [&'static str],
    );
    type Files = &'static [(&'static str, &'static str)];
    let cases: &[Refusal] = &[
        (
            "escape with ..",
            &[],
            "*** Add File: ../x.txt\n+x",
            "escapes_root",
            &["Add File `../x.txt`", "escapes the workspace root"],
        ),
        (
            "absolute path",
            &[],
            "*** Update File: /etc/x\n@@\n-a\n+b",
            "absolute_path",
            &["Update File `/etc/x`", "is absolute"],
        ),
        (
            "add over an existing file",
            &[("a.txt", "a\n")],
            "*** Add File: a.txt\n+x",
            "already_exists",
            &["Add File `a.txt`: the file already exists"],
        ),
        (
            "update a missing file",
            &[],
            "*** Update File: nope.txt\n@@\n-a\n+b",
            "not_found",
            &["Update File `nope.txt`: the file does not exist"],
        ),
        (
            "delete a missing file",
            &[],
            "*** Delete File: nope.txt",
            "not_found",
            &["Delete File `nope.txt`: the file does not exist"],
        ),
        (
            "move onto an existing file",
            &[("a.txt", "a\n"), ("b.txt", "b\n")],
            "*** Update File: a.txt\n*** Move to: b.txt",
            "already_exists",
            &["the Move to target `b.txt` already exists"],
        ),
        (
            "anchor not found",
            &[("a.txt", "a\n")],
            "*** Update File: a.txt\n@@ fn nope()\n-a\n+b",
            "no_match",
            &["hunk 1 (patch line 3): anchor `@@ fn nope()` was not found"],
        ),
        (
            "End of File hunk not at the end",
            &[("a.txt", "x\ny\n")],
            "*** Update File: a.txt\n@@\n-x\n+X\n*** End of File",
            "no_match",
            &["marked `*** End of File`", "They occur at lines 1-1"],
        ),
        (
            "hunks out of order",
            &[("a.txt", "a\nb\nc\n")],
            "*** Update File: a.txt\n@@\n-c\n+C\n@@\n-a\n+A",
            "no_match",
            &["hunk 2", "occurs at line 1, before line 4"],
        ),
        (
            "a line that is nowhere",
            &[("a.txt", "a\n")],
            "*** Update File: a.txt\n@@\n-zzz\n+b",
            "no_match",
            &["The first expected line `zzz` does not occur in the file."],
        ),
    ];
    for (name, files, body, want_kind, wants) in cases {
        let (dir, ws) = workspace(files);
        let (kind, text) = message(run(&ws, &wrap(body)).await.unwrap_err());
        assert_eq!(kind, *want_kind, "{name}: {text}");
        for want in *wants {
            assert!(text.contains(want), "{name}: missing {want:?} in:\n{text}");
        }
        assert!(text.ends_with("No file was changed."), "{name}: {text}");
        for (path, contents) in *files {
            assert_eq!(read(&dir, path).as_deref(), Some(*contents), "{name}");
        }
        assert!(ws.changes().is_empty(), "{name}");
    }
}

#[tokio::test]
async fn symlinked_files_are_refused() {
    let (dir, ws) = workspace(&[]);
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("secret.txt"), "secret\n").unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("secret.txt"),
        dir.path().join("link.txt"),
    )
    .unwrap();
    for body in [
        "*** Update File: link.txt\n@@\n-secret\n+pwned",
        "*** Delete File: link.txt",
        "*** Add File: link.txt\n+pwned",
    ] {
        let (kind, text) = message(run(&ws, &wrap(body)).await.unwrap_err());
        assert_eq!(kind, "symlink", "{body}: {text}");
        assert!(text.contains("refusing to follow symbolic link"), "{text}");
    }
    assert_eq!(
        fs::read_to_string(outside.path().join("secret.txt")).unwrap(),
        "secret\n"
    );
    assert!(
        fs::symlink_metadata(dir.path().join("link.txt"))
            .unwrap()
            .is_symlink()
    );
    assert!(ws.changes().is_empty());
}

#[tokio::test]
async fn malformed_patches_say_which_line_is_wrong() {
    let (_dir, ws) = workspace(&[("a.txt", "one\n")]);
    let cases = [
        (
            "*** Update File: a.txt\n-one\n+two\n*** End Patch",
            "invalid patch at line 1: expected `*** Begin Patch` as the first line, found \
             `*** Update File: a.txt`",
        ),
        (
            "*** Begin Patch\n*** Add File: b.txt\n+x",
            "invalid patch at line 3: expected `*** End Patch` as the last line, found `+x`",
        ),
        (
            "*** Begin Patch\n*** Update File: a.txt\n@@\n one\ntwo\n*** End Patch",
            "invalid patch at line 5: `two` in hunk 1 of `a.txt` is not a hunk line",
        ),
    ];
    for (input, want) in cases {
        let (kind, text) = message(run(&ws, input).await.unwrap_err());
        assert_eq!(kind, "invalid_input");
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    assert!(ws.changes().is_empty());
}

#[test]
fn a_failed_write_rolls_back_what_was_already_written() {
    let (dir, ws) = workspace(&[("a.txt", "orig\n"), ("b.txt", "b\n"), ("c.txt", "c\n")]);
    let steps = [
        Step::Write {
            path: "a.txt".into(),
            contents: b"changed\n".to_vec(),
            before: Some(b"orig\n".to_vec()),
        },
        Step::Write {
            path: "new.txt".into(),
            contents: b"new\n".to_vec(),
            before: None,
        },
        Step::Remove {
            path: "b.txt".into(),
            before: b"b\n".to_vec(),
        },
        Step::Rename {
            from: "c.txt".into(),
            to: "d.txt".into(),
        },
        // A regular file cannot be a directory: this write fails.
        Step::Write {
            path: "a.txt/child.txt".into(),
            contents: b"x".to_vec(),
            before: None,
        },
    ];
    let failure = run_steps(&ws, &steps).unwrap_err();
    assert_eq!(failure.path, PathBuf::from("a.txt/child.txt"));
    assert_eq!(failure.restored, ["c.txt", "b.txt", "new.txt", "a.txt"]);
    assert!(failure.not_restored.is_empty());
    assert_eq!(read(&dir, "a.txt").as_deref(), Some("orig\n"));
    assert_eq!(read(&dir, "b.txt").as_deref(), Some("b\n"));
    assert_eq!(read(&dir, "c.txt").as_deref(), Some("c\n"));
    assert_eq!(read(&dir, "d.txt"), None);
    assert_eq!(read(&dir, "new.txt"), None);
    let result = failure_result(failure);
    assert!(!result.success);
    assert!(
        result.output.contains(
            "writing `a.txt/child.txt` failed: \"a.txt\" is not a directory. The changes \
             already made were rolled back (c.txt, b.txt, new.txt, a.txt), so no file was \
             changed."
        ),
        "{}",
        result.output
    );
    assert_eq!(
        result.structured_metadata.unwrap()["rolled_back"],
        json!(["c.txt", "b.txt", "new.txt", "a.txt"])
    );
}

#[tokio::test]
async fn the_tool_is_an_exclusive_fs_tool_that_rebinds_and_checks_its_arguments() {
    let (_dir, ws) = workspace(&[]);
    let tool = ApplyPatch::new(Arc::clone(&ws));
    assert_eq!(tool.meta().name, "apply_patch");
    assert_eq!(tool.meta().tags, ["fs"]);
    assert_eq!(tool.meta().concurrency, ConcurrencyClass::Exclusive);
    let schema = &tool.meta().input_schema;
    assert_eq!(schema["additionalProperties"], json!(false));
    let mut registry = crate::tools::ToolRegistry::default();
    registry
        .register(Arc::new(ApplyPatch::new(Arc::clone(&ws))))
        .expect("the schema compiles");
    assert!(schema["properties"]["input"]["description"].is_string());
    let (kind, text) = message(
        tool.call(
            &ToolContext::detached("."),
            &json!({"input": "x", "extra": 1}),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(kind, "invalid_input");
    assert!(text.contains("unknown field `extra`"), "{text}");

    let (other_dir, other) = workspace(&[]);
    let rebound = tool.rebind_cwd(&other).unwrap();
    let result = rebound
        .call(
            &ToolContext::detached("."),
            &json!({"input": wrap("*** Add File: here.txt\n+x")}),
        )
        .await
        .unwrap();
    assert!(result.success);
    assert_eq!(read(&other_dir, "here.txt").as_deref(), Some("x\n"));
    assert!(ws.changes().is_empty());
    // Still an apply_patch: it carries apply_patch's own metadata, not a copy.
    assert!(std::ptr::eq(rebound.meta(), tool.meta()));
}
