//! Tests of the search tools, sharing one fixture: a workspace with a secret directory beside it.

use std::fs;
use std::os::unix::fs::symlink;
use std::sync::Arc;
use std::time::Duration;

use grep_regex::RegexMatcherBuilder;
use serde_json::{Value, json};
use tempfile::TempDir;

use super::glob::glob_files;
use super::grep::{GREP_LINE_CHARS, grep_files};
use super::list_dir::list_tree;
use super::walk::{PathFilter, compile_glob};
use super::*;
use crate::tools::{ConcurrencyClass, Tool, ToolContext};

struct Fixture {
    _dir: TempDir,
    root: PathBuf,
    outside: PathBuf,
    ws: Arc<Workspace>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    let outside = dir.path().join("outside");
    fs::create_dir(&root).unwrap();
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("secret.txt"), "needle top secret\n").unwrap();
    fs::write(outside.join("secret.rs"), "needle\n").unwrap();
    let ws = Workspace::new(&root);
    Fixture {
        _dir: dir,
        root,
        outside,
        ws,
    }
}

fn put(root: &Path, rel: &str, contents: impl AsRef<[u8]>) {
    let path = root.join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, contents).unwrap();
}

/// Runs a call and flattens it into (success, text) the way the registry would.
async fn call(tool: &dyn Tool, args: Value) -> (bool, String) {
    let outcome = tokio::time::timeout(
        Duration::from_secs(30),
        tool.call(&ToolContext::detached("."), &args),
    )
    .await
    .expect("tool call timed out");
    match outcome {
        Ok(result) => (result.success, result.output),
        Err(ToolError::Model { message, .. }) => (false, message),
        Err(err) => panic!("unexpected fatal error: {err}"),
    }
}

async fn ok(tool: &dyn Tool, args: Value) -> String {
    let (success, output) = call(tool, args).await;
    assert!(success, "expected success, got: {output}");
    output
}

async fn fails(tool: &dyn Tool, args: Value) -> String {
    let (success, output) = call(tool, args).await;
    assert!(!success, "expected failure, got: {output}");
    output
}

// ---- list_dir ----

#[tokio::test]
async fn list_dir_depth_sorting_and_directory_marker() {
    let f = fixture();
    put(&f.root, "b.txt", "b");
    put(&f.root, "a.txt", "a");
    put(&f.root, "sub/inner.txt", "i");
    put(&f.root, "sub/deep/x.txt", "x");
    put(&f.root, "sub/deep/deeper/y.txt", "y");
    let tool = ListDir::new(Arc::clone(&f.ws));
    assert_eq!(ok(&tool, json!({})).await, "./\n  a.txt\n  b.txt\n  sub/");
    assert_eq!(
        ok(&tool, json!({"depth": 2})).await,
        "./\n  a.txt\n  b.txt\n  sub/\n    deep/\n    inner.txt"
    );
    assert_eq!(
        ok(&tool, json!({"path": "sub", "depth": 5})).await,
        "sub/\n  deep/\n    deeper/\n      y.txt\n    x.txt\n  inner.txt"
    );
    put(&f.root, "empty/.keep", "");
    fs::remove_file(f.root.join("empty/.keep")).unwrap();
    assert_eq!(ok(&tool, json!({"path": "empty"})).await, "empty/ is empty");
}

#[tokio::test]
async fn list_dir_shows_symlinks_without_following_them() {
    let f = fixture();
    put(&f.root, "real/file.txt", "r");
    symlink(&f.outside, f.root.join("linkdir")).unwrap();
    symlink(f.outside.join("secret.txt"), f.root.join("linkfile")).unwrap();
    let tool = ListDir::new(Arc::clone(&f.ws));
    let out = ok(&tool, json!({"depth": 3})).await;
    assert_eq!(
        out,
        "./\n  linkdir -> (symlink, not followed)\n  linkfile -> (symlink, not followed)\n  real/\n    file.txt"
    );
    assert!(!out.contains("secret"));
    let err = fails(&tool, json!({"path": "linkdir"})).await;
    assert!(err.contains("symbolic link"), "{err}");
    let err = fails(&tool, json!({"path": "linkdir/"})).await;
    assert!(err.contains("symbolic link"), "{err}");
}

#[tokio::test]
async fn list_dir_refuses_escapes_and_bad_input() {
    let f = fixture();
    put(&f.root, "a.txt", "a");
    let tool = ListDir::new(Arc::clone(&f.ws));
    let err = fails(&tool, json!({"path": "../outside"})).await;
    assert!(err.contains("escapes the workspace root"), "{err}");
    let err = fails(&tool, json!({"path": f.outside.to_str().unwrap()})).await;
    assert!(err.contains("absolute"), "{err}");
    let err = fails(&tool, json!({"path": "a.txt"})).await;
    assert!(err.contains("not a directory"), "{err}");
    let err = fails(&tool, json!({"path": "missing"})).await;
    assert!(err.contains("does not exist"), "{err}");
    for depth in [0, 6] {
        let err = fails(&tool, json!({"depth": depth})).await;
        assert!(err.contains("between 1 and 5"), "{err}");
    }
    let err = fails(&tool, json!({"recursive": true})).await;
    assert!(err.contains("unknown field"), "{err}");
}

#[test]
fn list_dir_caps_entries_and_counts_the_rest() {
    let f = fixture();
    for name in ["a", "b", "c", "d"] {
        put(&f.root, &format!("{name}/x.txt"), "x");
    }
    let cancel = CancellationToken::new();
    let result = list_tree(&f.ws.open_root().unwrap(), Path::new(""), 2, 3, &cancel).unwrap();
    assert_eq!(
        result.output,
        "./\n  a/\n    x.txt\n  b/\n… 5 more entries not shown; list a subdirectory or use a smaller depth"
    );
    assert_eq!(
        result.structured_metadata,
        Some(json!({"entries": 3, "more": 5}))
    );
}

// ---- glob ----

#[tokio::test]
async fn glob_matches_recursively_and_sorts() {
    let f = fixture();
    for rel in [
        "z.rs",
        "a.rs",
        "src/lib.rs",
        "src/x/y.rs",
        "src-b/m.rs",
        "notes.txt",
    ] {
        put(&f.root, rel, "");
    }
    let tool = Glob::new(Arc::clone(&f.ws));
    assert_eq!(
        ok(&tool, json!({"pattern": "**/*.rs"})).await,
        "a.rs\nsrc/lib.rs\nsrc/x/y.rs\nsrc-b/m.rs\nz.rs"
    );
    assert_eq!(ok(&tool, json!({"pattern": "*.rs"})).await, "a.rs\nz.rs");
    assert_eq!(
        ok(&tool, json!({"pattern": "src/**/*.rs", "path": "src"})).await,
        "src/lib.rs\nsrc/x/y.rs"
    );
    // A pattern written relative to `path` works too.
    assert_eq!(
        ok(&tool, json!({"pattern": "*.rs", "path": "src"})).await,
        "src/lib.rs"
    );
    let out = ok(&tool, json!({"pattern": "**/*.py"})).await;
    assert_eq!(out, "No files match '**/*.py' under .");
}

#[tokio::test]
async fn glob_honours_gitignore_and_hidden_files() {
    let f = fixture();
    put(&f.root, ".gitignore", "target/\n*.log\n");
    put(&f.root, "keep.rs", "");
    put(&f.root, "debug.log", "");
    put(&f.root, "target/out.rs", "");
    put(&f.root, ".hidden.rs", "");
    put(&f.root, ".config/x.rs", "");
    put(&f.root, "sub/.ignore", "skip.rs\n");
    put(&f.root, "sub/skip.rs", "");
    put(&f.root, "sub/gen/a.log", "");
    put(&f.root, "sub/gen/b.rs", "");
    let tool = Glob::new(Arc::clone(&f.ws));
    assert_eq!(
        ok(&tool, json!({"pattern": "**/*"})).await,
        "keep.rs\nsub/gen/b.rs"
    );
    // Starting below the root still applies the root's ignore file.
    assert_eq!(
        ok(&tool, json!({"pattern": "**/*", "path": "sub/gen"})).await,
        "sub/gen/b.rs"
    );
    // Naming a hidden directory searches inside it.
    assert_eq!(
        ok(&tool, json!({"pattern": "**/*.rs", "path": ".config"})).await,
        ".config/x.rs"
    );
}

#[tokio::test]
async fn glob_ignores_ignore_files_above_the_root() {
    let f = fixture();
    // A catch-all ignore file in the directory holding the workspace.
    put(f.root.parent().unwrap(), ".gitignore", "*\n");
    put(&f.root, "src/a.rs", "");
    let tool = Glob::new(Arc::clone(&f.ws));
    assert_eq!(ok(&tool, json!({"pattern": "**/*.rs"})).await, "src/a.rs");
    assert_eq!(
        ok(&tool, json!({"pattern": "**/*.rs", "path": "src"})).await,
        "src/a.rs"
    );
}

#[tokio::test]
async fn ignore_rules_nest_and_linked_ignore_files_are_not_read() {
    let f = fixture();
    put(&f.root, ".gitignore", "*.log\n");
    put(&f.root, "a.log", "");
    put(&f.root, "keep/.gitignore", "!wanted.log\n");
    put(&f.root, "keep/wanted.log", "");
    put(&f.root, "keep/other.log", "");
    // A link to a catch-all ignore file outside would hide everything if it were read.
    put(&f.outside, "all", "*\n");
    put(&f.root, "sub/x.rs", "");
    symlink(f.outside.join("all"), f.root.join("sub/.gitignore")).unwrap();
    let tool = Glob::new(Arc::clone(&f.ws));
    assert_eq!(
        ok(&tool, json!({"pattern": "**/*"})).await,
        "keep/wanted.log\nsub/x.rs"
    );
    assert_eq!(
        ok(&tool, json!({"pattern": "**/*", "path": "keep"})).await,
        "keep/wanted.log"
    );
}

#[tokio::test]
async fn glob_never_follows_symlinks() {
    let f = fixture();
    put(&f.root, "own.rs", "");
    symlink(&f.outside, f.root.join("linkdir")).unwrap();
    symlink(f.outside.join("secret.rs"), f.root.join("link.rs")).unwrap();
    let tool = Glob::new(Arc::clone(&f.ws));
    assert_eq!(ok(&tool, json!({"pattern": "**/*.rs"})).await, "own.rs");
    let err = fails(&tool, json!({"pattern": "**/*.rs", "path": "linkdir"})).await;
    assert!(err.contains("symbolic link"), "{err}");
    let err = fails(&tool, json!({"pattern": "*", "path": ".."})).await;
    assert!(err.contains("escapes"), "{err}");
}

#[test]
fn glob_caps_output_and_counts_the_rest() {
    let f = fixture();
    for name in ["e", "d", "c", "b", "a"] {
        put(&f.root, &format!("{name}.txt"), "");
    }
    let filter = PathFilter {
        matcher: compile_glob("glob", "pattern", "*.txt").unwrap(),
        by_name: false,
    };
    let cancel = CancellationToken::new();
    let result = glob_files(
        &f.ws.open_root().unwrap(),
        Path::new(""),
        &filter,
        "*.txt",
        3,
        &cancel,
    )
    .unwrap();
    assert_eq!(
        result.output,
        "a.txt\nb.txt\nc.txt\n… 2 more not shown; narrow the pattern or the path"
    );
}

#[tokio::test]
async fn glob_reports_invalid_patterns() {
    let f = fixture();
    let tool = Glob::new(Arc::clone(&f.ws));
    let err = fails(&tool, json!({"pattern": "src/[abc"})).await;
    assert!(err.starts_with("glob: invalid pattern:"), "{err}");
    assert!(err.contains("unclosed character class"), "{err}");
    let err = fails(&tool, json!({})).await;
    assert!(err.contains("missing field `pattern`"), "{err}");
}

// ---- grep ----

fn grep_tree(root: &Path) {
    put(root, "src/a.rs", "fn main() {\n    let needle = 1;\n}\n");
    put(root, "b.txt", "needle\nnothing\nNEEDLE\r\n");
    put(root, "docs/c.md", "a Needle here\n");
}

#[tokio::test]
async fn grep_reports_file_line_text_sorted() {
    let f = fixture();
    grep_tree(&f.root);
    let tool = Grep::new(Arc::clone(&f.ws));
    assert_eq!(
        ok(&tool, json!({"pattern": "needle"})).await,
        "b.txt:1:needle\nsrc/a.rs:2:    let needle = 1;"
    );
    assert_eq!(
        ok(
            &tool,
            json!({"pattern": "needle", "case_insensitive": true})
        )
        .await,
        "b.txt:1:needle\nb.txt:3:NEEDLE\ndocs/c.md:1:a Needle here\nsrc/a.rs:2:    let needle = 1;"
    );
    assert_eq!(
        ok(&tool, json!({"pattern": "n[e]+dle", "path": "src/a.rs"})).await,
        "src/a.rs:2:    let needle = 1;"
    );
    let out = ok(&tool, json!({"pattern": "absent"})).await;
    assert_eq!(out, "No matches for /absent/ under . (3 files searched)");
}

#[tokio::test]
async fn grep_glob_filter_by_name_or_path() {
    let f = fixture();
    grep_tree(&f.root);
    put(&f.root, "src/deep/d.rs", "needle\n");
    let tool = Grep::new(Arc::clone(&f.ws));
    assert_eq!(
        ok(&tool, json!({"pattern": "needle", "glob": "*.rs"})).await,
        "src/a.rs:2:    let needle = 1;\nsrc/deep/d.rs:1:needle"
    );
    assert_eq!(
        ok(&tool, json!({"pattern": "needle", "glob": "src/*.rs"})).await,
        "src/a.rs:2:    let needle = 1;"
    );
    assert_eq!(
        ok(
            &tool,
            json!({"pattern": "(?i)needle", "glob": "*.{md,txt}"})
        )
        .await,
        "b.txt:1:needle\nb.txt:3:NEEDLE\ndocs/c.md:1:a Needle here"
    );
    let err = fails(&tool, json!({"pattern": "x", "glob": "[oops"})).await;
    assert!(err.starts_with("grep: invalid glob:"), "{err}");
}

#[tokio::test]
async fn grep_skips_binary_files() {
    let f = fixture();
    put(&f.root, "bin.dat", b"needle\x00\x01\x02needle\n");
    put(&f.root, "text.txt", "needle\n");
    let tool = Grep::new(Arc::clone(&f.ws));
    let result = tool
        .call(&ToolContext::detached("."), &json!({"pattern": "needle"}))
        .await
        .unwrap();
    assert_eq!(result.output, "text.txt:1:needle");
    let meta = result.structured_metadata.unwrap();
    assert_eq!(meta["binary_files_skipped"], 1);
    assert_eq!(meta["files_searched"], 2);
}

#[tokio::test]
async fn grep_truncates_at_max_results() {
    let f = fixture();
    put(&f.root, "a.txt", "needle 1\nneedle 2\nneedle 3\n");
    put(&f.root, "b.txt", "needle 4\nneedle 5\n");
    let tool = Grep::new(Arc::clone(&f.ws));
    assert_eq!(
        ok(&tool, json!({"pattern": "needle", "max_results": 4})).await,
        "a.txt:1:needle 1\na.txt:2:needle 2\na.txt:3:needle 3\nb.txt:1:needle 4\n\
         … results truncated at 4; narrow the pattern, path or glob, or raise max_results"
    );
    assert_eq!(
        ok(&tool, json!({"pattern": "needle", "max_results": 2})).await,
        "a.txt:1:needle 1\na.txt:2:needle 2\n\
         … results truncated at 2; narrow the pattern, path or glob, or raise max_results"
    );
    // Exactly as many matches as allowed is not a truncation.
    let out = ok(&tool, json!({"pattern": "needle", "max_results": 5})).await;
    assert!(out.ends_with("b.txt:2:needle 5"), "{out}");
    for bad in [0, 1_001] {
        let err = fails(&tool, json!({"pattern": "needle", "max_results": bad})).await;
        assert!(err.contains("between 1 and 1000"), "{err}");
    }
}

#[tokio::test]
async fn grep_honours_gitignore() {
    let f = fixture();
    put(&f.root, ".gitignore", "ignored.txt\n*.gen\n");
    put(&f.root, "ignored.txt", "needle\n");
    put(&f.root, "kept.txt", "needle\n");
    put(&f.root, "sub/x.gen", "needle\n");
    put(&f.root, "sub/y.txt", "needle\n");
    put(&f.root, ".hidden.txt", "needle\n");
    let tool = Grep::new(Arc::clone(&f.ws));
    assert_eq!(
        ok(&tool, json!({"pattern": "needle"})).await,
        "kept.txt:1:needle\nsub/y.txt:1:needle"
    );
    assert_eq!(
        ok(&tool, json!({"pattern": "needle", "path": "sub"})).await,
        "sub/y.txt:1:needle"
    );
}

#[tokio::test]
async fn grep_never_reads_through_symlinks() {
    let f = fixture();
    put(&f.root, "own.txt", "needle mine\n");
    symlink(f.outside.join("secret.txt"), f.root.join("link.txt")).unwrap();
    symlink(&f.outside, f.root.join("linkdir")).unwrap();
    let tool = Grep::new(Arc::clone(&f.ws));
    let out = ok(&tool, json!({"pattern": "needle"})).await;
    assert_eq!(out, "own.txt:1:needle mine");
    let out = ok(&tool, json!({"pattern": "secret", "glob": "*.txt"})).await;
    assert!(out.starts_with("No matches"), "{out}");
    for path in ["link.txt", "linkdir", "linkdir/secret.txt"] {
        let err = fails(&tool, json!({"pattern": "needle", "path": path})).await;
        assert!(err.contains("symbolic link"), "{path}: {err}");
    }
    let err = fails(&tool, json!({"pattern": "needle", "path": "../outside"})).await;
    assert!(err.contains("escapes"), "{err}");
}

#[tokio::test]
async fn grep_stops_a_file_at_a_line_over_the_limit_and_says_so() {
    let f = fixture();
    let mut big = b"needle before\n".to_vec();
    big.resize(big.len() + 3 * GREP_MAX_LINE_BYTES, b'x');
    big.extend_from_slice(b" needle inside the long line\nneedle after\n");
    put(&f.root, "big.txt", &big);
    put(&f.root, "small.txt", "needle\n");
    let tool = Grep::new(Arc::clone(&f.ws));
    let result = tool
        .call(&ToolContext::detached("."), &json!({"pattern": "needle"}))
        .await
        .unwrap();
    assert!(result.success, "{}", result.output);
    assert_eq!(
        result.output,
        format!(
            "big.txt:1:needle before\nsmall.txt:1:needle\n(1 files searched only up to a line \
             longer than {GREP_MAX_LINE_BYTES} bytes, which was skipped with the rest of the \
             file: big.txt)"
        )
    );
    let meta = result.structured_metadata.unwrap();
    assert_eq!(meta["long_line_files"], json!(["big.txt"]));
    assert_eq!(meta["files_searched"], 2);
    assert_eq!(meta["unreadable"], 0);
    // A line just under the limit is still searched whole.
    let mut fits = vec![b'y'; GREP_MAX_LINE_BYTES / 2];
    fits.extend_from_slice(b" needle\n");
    put(&f.root, "big.txt", &fits);
    let out = ok(&tool, json!({"pattern": "needle$", "path": "big.txt"})).await;
    assert!(out.starts_with("big.txt:1:yyy"), "{}", &out[..40]);
}

/// The hostile case: a directory of the workspace flipped 1,000 times with a symlink to a
/// directory outside while the three tools run over it. No name or contents from outside
/// may show in any answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_swapped_for_a_symlink_during_walks_leaks_nothing() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    let f = fixture();
    put(&f.outside, "passwd", "root:x:0:0 needle\n");
    put(&f.outside, "etc/passwd", "daemon:x:1:1 needle\n");
    put(&f.root, "d/own.txt", "needle inside\n");
    put(&f.root, "d/deep/mine.txt", "needle deep\n");
    put(&f.root, "alt/other.txt", "needle alt\n");
    // `d` and `swap` trade places on every flip: one is a directory, the other a link out.
    symlink(&f.outside, f.root.join("swap")).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let flipper = {
        let (d, swap) = (f.root.join("d"), f.root.join("swap"));
        let (done, calls) = (Arc::clone(&done), Arc::clone(&calls));
        std::thread::spawn(move || {
            // Flipping starts with the first call and then runs flat out: the more flips
            // land inside one walk, the likelier a walk that follows links is caught.
            while calls.load(Ordering::SeqCst) == 0 {
                std::thread::yield_now();
            }
            for _ in 0..1_000 {
                rustix::fs::renameat_with(
                    rustix::fs::CWD,
                    &d,
                    rustix::fs::CWD,
                    &swap,
                    rustix::fs::RenameFlags::EXCHANGE,
                )
                .unwrap();
            }
            done.store(true, Ordering::SeqCst);
        })
    };
    let tools: [(Arc<dyn Tool>, Value); 5] = [
        (
            Arc::new(Glob::new(Arc::clone(&f.ws))),
            json!({"pattern": "d*/**/passwd"}),
        ),
        (
            Arc::new(Glob::new(Arc::clone(&f.ws))),
            json!({"pattern": "**/*"}),
        ),
        (
            Arc::new(Grep::new(Arc::clone(&f.ws))),
            json!({"pattern": "needle|root"}),
        ),
        (
            Arc::new(ListDir::new(Arc::clone(&f.ws))),
            json!({"depth": 5}),
        ),
        (
            Arc::new(ListDir::new(Arc::clone(&f.ws))),
            json!({"path": "d", "depth": 3}),
        ),
    ];
    let mut rounds = 0;
    while !done.load(Ordering::SeqCst) && rounds < 100_000 {
        rounds += 1;
        for (tool, args) in &tools {
            calls.fetch_add(1, Ordering::SeqCst);
            let (_, out) = call(tool.as_ref(), args.clone()).await;
            // An answer that found nothing repeats the pattern; that is no leak.
            let out = out.replace(args["pattern"].as_str().unwrap_or("\0"), "");
            for leak in ["passwd", "root:x", "daemon", "etc", "secret"] {
                assert!(!out.contains(leak), "{} leaked {leak}: {out}", tool.name());
            }
        }
    }
    flipper.join().unwrap();
    assert!(calls.load(Ordering::SeqCst) > 0);
    // The same tools still see the workspace's own files once the flipping stops.
    let out = ok(tools[1].0.as_ref(), tools[1].1.clone()).await;
    assert!(
        out.contains("own.txt") && out.contains("other.txt"),
        "{out}"
    );
}

#[tokio::test]
async fn grep_reports_invalid_regex() {
    let f = fixture();
    let tool = Grep::new(Arc::clone(&f.ws));
    let err = fails(&tool, json!({"pattern": "fn ("})).await;
    assert!(
        err.starts_with("grep: invalid regular expression:"),
        "{err}"
    );
    assert!(err.contains("unclosed group"), "{err}");
    let err = fails(&tool, json!({"pattern": "a\\nb"})).await;
    assert!(
        err.starts_with("grep: invalid regular expression:"),
        "{err}"
    );
}

#[tokio::test]
async fn grep_clips_long_lines() {
    let f = fixture();
    let long = format!("needle{}\n", "é".repeat(700));
    put(&f.root, "long.txt", long);
    let tool = Grep::new(Arc::clone(&f.ws));
    let out = ok(&tool, json!({"pattern": "needle"})).await;
    let text = out.strip_prefix("long.txt:1:").unwrap();
    assert_eq!(text.chars().count(), GREP_LINE_CHARS + 1);
    assert!(text.ends_with('…'));
}

#[tokio::test]
async fn cancelled_calls_stop() {
    let f = fixture();
    grep_tree(&f.root);
    let mut ctx = ToolContext::detached(&f.root);
    ctx.cancel = CancellationToken::new();
    ctx.cancel.cancel();
    let tools: [Arc<dyn Tool>; 3] = [
        Arc::new(ListDir::new(Arc::clone(&f.ws))),
        Arc::new(Glob::new(Arc::clone(&f.ws))),
        Arc::new(Grep::new(Arc::clone(&f.ws))),
    ];
    for tool in tools {
        let args = if tool.name() == "list_dir" {
            json!({})
        } else {
            json!({"pattern": "x"})
        };
        let call = tool.call(&ctx, &args);
        let outcome = tokio::time::timeout(Duration::from_secs(30), call).await;
        match outcome.unwrap() {
            Err(ToolError::Model { kind, message }) => {
                assert_eq!(kind, "cancelled");
                assert_eq!(message, format!("{} was cancelled", tool.name()));
            }
            other => panic!("{}: {other:?}", tool.name()),
        }
    }
}

#[test]
fn walk_stops_when_cancelled_midway() {
    let f = fixture();
    for i in 0..20 {
        put(&f.root, &format!("f{i}.txt"), "needle\n");
    }
    let matcher = RegexMatcherBuilder::new().build("needle").unwrap();
    let cancel = CancellationToken::new();
    let found = grep_files(
        &f.ws.open_root().unwrap(),
        Path::new(""),
        &matcher,
        None,
        1000,
        &cancel,
    )
    .unwrap();
    assert_eq!(found.lines.len(), 20);
    cancel.cancel();
    let err = grep_files(
        &f.ws.open_root().unwrap(),
        Path::new(""),
        &matcher,
        None,
        1000,
        &cancel,
    )
    .unwrap_err();
    assert!(matches!(
        err,
        ToolError::Model {
            kind: "cancelled",
            ..
        }
    ));
}

#[tokio::test]
async fn tools_describe_themselves_and_rebind() {
    let f = fixture();
    let other = fixture();
    put(&other.root, "there.rs", "needle\n");
    let tools: [Arc<dyn Tool>; 3] = [
        Arc::new(ListDir::new(Arc::clone(&f.ws))),
        Arc::new(Glob::new(Arc::clone(&f.ws))),
        Arc::new(Grep::new(Arc::clone(&f.ws))),
    ];
    for tool in &tools {
        assert_eq!(tool.tags(), ["search"]);
        assert_eq!(tool.concurrency_class(), ConcurrencyClass::Safe);
        let schema = tool.input_schema();
        assert_eq!(schema["additionalProperties"], false);
        for (name, prop) in schema["properties"].as_object().unwrap() {
            assert!(prop["description"].is_string(), "{}.{name}", tool.name());
        }
    }
    let rebound = tools[2].rebind_cwd(&other.ws).unwrap();
    // Still a grep: it carries grep's own metadata, not a copy.
    assert!(std::ptr::eq(rebound.meta(), tools[2].meta()));
    assert_eq!(
        ok(rebound.as_ref(), json!({"pattern": "needle"})).await,
        "there.rs:1:needle"
    );
}
