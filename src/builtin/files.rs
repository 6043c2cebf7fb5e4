//! read_file, write_file and edit_file: the plain file tools, all through the workspace's
//! symlink-safe layer.

use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::parse_args;
use crate::tools::workspace::{ChangeKind, Workspace};
use crate::tools::{CallSubject, Effects, Tool, ToolContext, ToolError, ToolMeta, ToolResult};

/// Largest file the file tools read.
pub const MAX_FILE_BYTES: u64 = 10 * 1024 * 1024;
/// Most text `read_file` returns in one call.
pub const MAX_READ_OUTPUT_BYTES: usize = 256 * 1024;
/// Lines `read_file` returns when no limit is given.
pub const DEFAULT_READ_LINES: usize = 2000;
/// Longest line `read_file` shows whole.
const MAX_LINE_CHARS: usize = 2000;
/// How much of a file is inspected for NUL bytes to call it binary.
const BINARY_SNIFF_BYTES: usize = 8192;

/// Reads a text file as UTF-8 (lossily), refusing binary files.
fn read_text(workspace: &Workspace, tool: &str, path: &str) -> Result<String, ToolError> {
    let rel = workspace.resolve(path)?;
    let bytes = workspace.read(&rel, MAX_FILE_BYTES)?;
    if bytes[..bytes.len().min(BINARY_SNIFF_BYTES)].contains(&0) {
        return Err(ToolError::model(
            "binary_file",
            format!(
                "{tool}: {path} looks like a binary file ({} bytes); it works on text files only",
                bytes.len()
            ),
        ));
    }
    Ok(match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(err) => String::from_utf8_lossy(err.as_bytes()).into_owned(),
    })
}

/// Reads a text file with line numbers.
pub struct ReadFile {
    workspace: Arc<Workspace>,
}

impl ReadFile {
    /// A read_file bound to `workspace`.
    pub fn new(workspace: Arc<Workspace>) -> Self {
        Self { workspace }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    path: String,
    offset: Option<usize>,
    limit: Option<usize>,
}

#[async_trait]
impl Tool for ReadFile {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "read_file",
                "Read a text file of the workspace. Returns lines prefixed with their 1-based line \
                 numbers and a tab. Use offset and limit to page through long files; the output \
                 says where to continue. Binary files and files over 10 MiB are refused.",
                json!({
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": "File path relative to the workspace root."},
                        "offset": {"type": "integer", "minimum": 1, "description": "First line to return (1-based). Default 1."},
                        "limit": {"type": "integer", "minimum": 1, "description": "Number of lines to return. Default 2000."}
                    },
                    "required": ["path"],
                    "additionalProperties": false
                }),
Effects::NONE,
            )
            .groups(&["fs"])
            .base()
            .contract()
            .tags(&["fs"])
        });
        &META
    }

    async fn call(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        let args: ReadArgs = parse_args(&self.meta().name, args)?;
        let text = read_text(&self.workspace, &self.meta().name, &args.path)?;
        if text.is_empty() {
            return Ok(ToolResult::ok(format!("{} is empty", args.path)));
        }
        let offset = args.offset.unwrap_or(1).max(1);
        let limit = args.limit.unwrap_or(DEFAULT_READ_LINES).max(1);
        let total = text.lines().count();
        if offset > total {
            return Err(ToolError::model(
                "invalid_input",
                format!(
                    "offset {offset} is past the end of {} ({total} lines)",
                    args.path
                ),
            ));
        }
        let mut out = String::new();
        let mut last = offset - 1;
        for (index, line) in text.lines().enumerate().skip(offset - 1).take(limit) {
            let line = line.strip_suffix('\r').unwrap_or(line);
            let shown = match line.char_indices().nth(MAX_LINE_CHARS) {
                Some((cut, _)) => format!("{}… [line truncated]", &line[..cut]),
                None => line.to_string(),
            };
            let entry = format!("{:>6}\t{shown}\n", index + 1);
            if out.len() + entry.len() > MAX_READ_OUTPUT_BYTES {
                break;
            }
            out.push_str(&entry);
            last = index + 1;
        }
        if last < total {
            out.push_str(&format!(
                "[showing lines {offset}-{last} of {total}; continue with offset={}]\n",
                last + 1
            ));
        }
        Ok(ToolResult::ok(out))
    }

    fn rebind_cwd(&self, workspace: &Arc<Workspace>) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(Self::new(Arc::clone(workspace))))
    }
}

/// Writes a whole file atomically.
pub struct WriteFile {
    workspace: Arc<Workspace>,
}

impl WriteFile {
    /// A write_file bound to `workspace`.
    pub fn new(workspace: Arc<Workspace>) -> Self {
        Self { workspace }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    path: String,
    content: String,
}

#[async_trait]
impl Tool for WriteFile {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "write_file",
                "Create or overwrite a file of the workspace with the given content. Missing \
                 parent directories are created. The write is atomic: readers see the old or the \
                 new file, never half of it. Prefer edit_file or apply_patch for changes to \
                 existing files.",
                json!({
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": "File path relative to the workspace root."},
                        "content": {"type": "string", "description": "The complete new content of the file."}
                    },
                    "required": ["path", "content"],
                    "additionalProperties": false
                }),
                Effects::WRITES_FILES,
            )
            .subject(CallSubject::WrittenPath("path"))
            .groups(&["fs"])
            .base()
            .contract()
            .tags(&["fs"])
            .exclusive()
        });
        &META
    }

    async fn call(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        let args: WriteArgs = parse_args(&self.meta().name, args)?;
        let rel = self.workspace.resolve(&args.path)?;
        if rel.as_os_str().is_empty() {
            return Err(ToolError::model(
                "invalid_input",
                "write_file needs a file path, not the workspace root",
            ));
        }
        let kind = self
            .workspace
            .write(&self.meta().name, &rel, args.content.as_bytes())?;
        let verb = match kind {
            ChangeKind::Created => "created",
            _ => "overwrote",
        };
        let mut result = ToolResult::ok(format!(
            "{verb} {} ({} bytes)",
            args.path,
            args.content.len()
        ));
        result.file_modified = Some(rel);
        Ok(result)
    }

    fn rebind_cwd(&self, workspace: &Arc<Workspace>) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(Self::new(Arc::clone(workspace))))
    }
}

/// Replaces an exact string in a file.
pub struct EditFile {
    workspace: Arc<Workspace>,
}

impl EditFile {
    /// An edit_file bound to `workspace`.
    pub fn new(workspace: Arc<Workspace>) -> Self {
        Self { workspace }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EditArgs {
    path: String,
    old_string: String,
    new_string: String,
    #[serde(default)]
    replace_all: bool,
}

#[async_trait]
impl Tool for EditFile {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "edit_file",
                "Replace an exact string in a file of the workspace. old_string must match the \
                 file exactly (including indentation) and, unless replace_all is true, exactly \
                 once: include enough surrounding lines to make it unique. Read the file first.",
                json!({
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": "File path relative to the workspace root."},
                        "old_string": {"type": "string", "description": "The exact text to replace; must not be empty."},
                        "new_string": {"type": "string", "description": "The text to put in its place."},
                        "replace_all": {"type": "boolean", "description": "Replace every occurrence instead of requiring exactly one. Default false."}
                    },
                    "required": ["path", "old_string", "new_string"],
                    "additionalProperties": false
                }),
                Effects::WRITES_FILES,
            )
            .subject(CallSubject::WrittenPath("path"))
            .groups(&["fs"])
            .base()
            .contract()
            .tags(&["fs"])
            .exclusive()
        });
        &META
    }

    async fn call(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        let args: EditArgs = parse_args(&self.meta().name, args)?;
        if args.old_string.is_empty() {
            return Err(ToolError::model(
                "invalid_input",
                "old_string is empty; to create or overwrite a file use write_file",
            ));
        }
        if args.old_string == args.new_string {
            return Err(ToolError::model(
                "invalid_input",
                "old_string and new_string are identical; nothing would change",
            ));
        }
        let rel = self.workspace.resolve(&args.path)?;
        let bytes = self.workspace.read(&rel, MAX_FILE_BYTES)?;
        // Writing back a lossy decoding would silently change every byte that is not UTF-8.
        let text = String::from_utf8(bytes).map_err(|_| {
            ToolError::model(
                "not_utf8",
                format!(
                    "{} is not UTF-8 text; edit_file would corrupt it (use apply_patch or \
                     write_file with the whole content)",
                    args.path
                ),
            )
        })?;
        let (old, new) = line_endings_of(&text, &args.old_string, &args.new_string);
        let count = text.matches(old.as_str()).count();
        if count == 0 {
            return Err(ToolError::model(
                "no_match",
                format!(
                    "old_string was not found in {}; read the file and copy the text exactly, \
                     including whitespace",
                    args.path
                ),
            ));
        }
        if count > 1 && !args.replace_all {
            return Err(ToolError::model(
                "ambiguous_match",
                format!(
                    "old_string was found {count} times in {}; include more surrounding text to \
                     make it unique, or set replace_all to true",
                    args.path
                ),
            ));
        }
        let replaced = if args.replace_all { count } else { 1 };
        let grown = (new.len() as u64)
            .saturating_sub(old.len() as u64)
            .saturating_mul(replaced as u64)
            .saturating_add(text.len() as u64);
        if grown > MAX_FILE_BYTES {
            return Err(ToolError::model(
                "too_large",
                format!(
                    "the edit would make {} {grown} bytes, over the {MAX_FILE_BYTES}-byte limit",
                    args.path
                ),
            ));
        }
        let updated = if args.replace_all {
            text.replace(old.as_str(), &new)
        } else {
            text.replacen(old.as_str(), &new, 1)
        };
        self.workspace
            .write(&self.meta().name, &rel, updated.as_bytes())?;
        let mut result = ToolResult::ok(format!(
            "replaced {count} occurrence{} in {}",
            if count == 1 { "" } else { "s" },
            args.path
        ));
        result.file_modified = Some(rel);
        Ok(result)
    }

    fn rebind_cwd(&self, workspace: &Arc<Workspace>) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(Self::new(Arc::clone(workspace))))
    }
}

/// Models write `\n`; in a CRLF file whose text only matches with `\r\n`, use the file's endings.
fn line_endings_of(text: &str, old: &str, new: &str) -> (String, String) {
    let crlf = |s: &str| s.replace("\r\n", "\n").replace('\n', "\r\n");
    if !text.contains(old) && text.contains("\r\n") && old.contains('\n') {
        (crlf(old), crlf(new))
    } else {
        (old.to_string(), new.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn setup() -> (tempfile::TempDir, Arc<Workspace>) {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::new(dir.path());
        (dir, ws)
    }

    async fn run(tool: &dyn Tool, args: Value) -> ToolResult {
        match tool.call(&ToolContext::detached("."), &args).await {
            Ok(result) => result,
            Err(ToolError::Model { kind, message }) => {
                ToolResult::failure(message).with_metadata(json!({ "kind": kind }))
            }
            Err(err) => panic!("fatal: {err}"),
        }
    }

    fn kind(result: &ToolResult) -> &str {
        result.structured_metadata.as_ref().unwrap()["kind"]
            .as_str()
            .unwrap()
    }

    #[tokio::test]
    async fn read_file_numbers_lines_and_pages() {
        let (dir, ws) = setup();
        let text: String = (1..=10).map(|i| format!("line {i}\n")).collect();
        std::fs::write(dir.path().join("a.txt"), text).unwrap();
        let read = ReadFile::new(ws);
        let all = run(&read, json!({"path": "a.txt"})).await;
        assert!(all.success);
        assert!(all.output.starts_with("     1\tline 1\n     2\tline 2\n"));
        assert!(!all.output.contains("continue"));
        let page = run(&read, json!({"path": "a.txt", "offset": 4, "limit": 3})).await;
        assert_eq!(
            page.output,
            "     4\tline 4\n     5\tline 5\n     6\tline 6\n\
             [showing lines 4-6 of 10; continue with offset=7]\n"
        );
        let past = run(&read, json!({"path": "a.txt", "offset": 11})).await;
        assert!(
            !past.success && past.output.contains("10 lines"),
            "{}",
            past.output
        );
    }

    #[tokio::test]
    async fn read_file_refuses_binary_missing_and_huge_files() {
        let (dir, ws) = setup();
        std::fs::write(dir.path().join("bin"), [0x7f, b'E', b'L', b'F', 0, 1]).unwrap();
        let big = std::fs::File::create(dir.path().join("big")).unwrap();
        big.set_len(MAX_FILE_BYTES + 1).unwrap();
        let read = ReadFile::new(ws);
        let bin = run(&read, json!({"path": "bin"})).await;
        assert_eq!(kind(&bin), "binary_file");
        assert!(bin.output.contains("binary"));
        assert_eq!(
            kind(&run(&read, json!({"path": "nope"})).await),
            "not_found"
        );
        assert_eq!(kind(&run(&read, json!({"path": "big"})).await), "too_large");
        assert_eq!(
            kind(&run(&read, json!({"path": "../etc/passwd"})).await),
            "escapes_root"
        );
        assert_eq!(
            kind(&run(&read, json!({"file": "x"})).await),
            "invalid_input"
        );
    }

    #[tokio::test]
    async fn read_file_caps_output_and_says_where_to_continue() {
        let (dir, ws) = setup();
        let line = "x".repeat(1000);
        let text: String = (0..1000).map(|_| format!("{line}\n")).collect();
        std::fs::write(dir.path().join("wide.txt"), text).unwrap();
        let out = run(&ReadFile::new(ws), json!({"path": "wide.txt"})).await;
        assert!(out.output.len() <= MAX_READ_OUTPUT_BYTES + 100);
        assert!(
            out.output.contains("of 1000; continue with offset="),
            "tail missing"
        );
    }

    #[tokio::test]
    async fn write_file_creates_parents_and_records_the_change() {
        let (dir, ws) = setup();
        let write = WriteFile::new(Arc::clone(&ws));
        let out = run(&write, json!({"path": "a/b/c.txt", "content": "hi\n"})).await;
        assert!(out.success, "{}", out.output);
        assert_eq!(out.file_modified.as_deref(), Some(Path::new("a/b/c.txt")));
        assert_eq!(
            std::fs::read_to_string(dir.path().join("a/b/c.txt")).unwrap(),
            "hi\n"
        );
        let again = run(&write, json!({"path": "a/b/c.txt", "content": "bye\n"})).await;
        assert!(again.output.starts_with("overwrote"));
        let kinds: Vec<ChangeKind> = ws.changes().iter().map(|c| c.kind).collect();
        assert_eq!(kinds, [ChangeKind::Created, ChangeKind::Modified]);
        assert_eq!(
            kind(&run(&write, json!({"path": ".", "content": ""})).await),
            "invalid_input"
        );
    }

    #[tokio::test]
    async fn write_file_refuses_symlinks_and_escapes() {
        let (dir, ws) = setup();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("target"), "keep").unwrap();
        std::os::unix::fs::symlink(outside.path().join("target"), dir.path().join("link")).unwrap();
        let write = WriteFile::new(ws);
        let out = run(&write, json!({"path": "link", "content": "pwned"})).await;
        assert_eq!(kind(&out), "symlink");
        assert_eq!(
            std::fs::read_to_string(outside.path().join("target")).unwrap(),
            "keep"
        );
        let abs = format!("{}/x", outside.path().display());
        assert_eq!(
            kind(&run(&write, json!({"path": abs, "content": "x"})).await),
            "absolute_path"
        );
    }

    #[tokio::test]
    async fn edit_file_replaces_exactly_one_match() {
        let (dir, ws) = setup();
        std::fs::write(dir.path().join("m.rs"), "fn a() {}\nfn b() {}\n").unwrap();
        let edit = EditFile::new(ws);
        let out = run(
            &edit,
            json!({"path": "m.rs", "old_string": "fn b() {}", "new_string": "fn c() {}"}),
        )
        .await;
        assert!(out.success, "{}", out.output);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("m.rs")).unwrap(),
            "fn a() {}\nfn c() {}\n"
        );
    }

    #[tokio::test]
    async fn edit_file_reports_zero_and_several_matches() {
        let (dir, ws) = setup();
        std::fs::write(dir.path().join("m.txt"), "x = 1\nx = 1\n").unwrap();
        let edit = EditFile::new(ws);
        let none = run(
            &edit,
            json!({"path": "m.txt", "old_string": "y", "new_string": "z"}),
        )
        .await;
        assert_eq!(kind(&none), "no_match");
        let many = run(
            &edit,
            json!({"path": "m.txt", "old_string": "x = 1", "new_string": "x = 2"}),
        )
        .await;
        assert_eq!(kind(&many), "ambiguous_match");
        assert!(many.output.contains("found 2 times"), "{}", many.output);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("m.txt")).unwrap(),
            "x = 1\nx = 1\n",
            "refused edits change nothing"
        );
        let all = run(
            &edit,
            json!({"path": "m.txt", "old_string": "x = 1", "new_string": "x = 2", "replace_all": true}),
        )
        .await;
        assert!(all.output.contains("replaced 2 occurrences"));
        assert_eq!(
            std::fs::read_to_string(dir.path().join("m.txt")).unwrap(),
            "x = 2\nx = 2\n"
        );
        let empty = run(
            &edit,
            json!({"path": "m.txt", "old_string": "", "new_string": "z"}),
        )
        .await;
        assert_eq!(kind(&empty), "invalid_input");
    }

    #[tokio::test]
    async fn edit_file_refuses_non_utf8_files_and_runaway_growth() {
        let (dir, ws) = setup();
        std::fs::write(dir.path().join("latin1.txt"), b"caf\xe9 = 1\n").unwrap();
        std::fs::write(dir.path().join("a.txt"), "a".repeat(1000)).unwrap();
        let edit = EditFile::new(ws);
        let latin = run(
            &edit,
            json!({"path": "latin1.txt", "old_string": "1", "new_string": "2"}),
        )
        .await;
        assert_eq!(kind(&latin), "not_utf8");
        assert_eq!(
            std::fs::read(dir.path().join("latin1.txt")).unwrap(),
            b"caf\xe9 = 1\n",
            "the file is untouched"
        );
        let huge = run(
            &edit,
            json!({"path": "a.txt", "old_string": "a", "new_string": "b".repeat(20_000), "replace_all": true}),
        )
        .await;
        assert_eq!(kind(&huge), "too_large");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("a.txt"))
                .unwrap()
                .len(),
            1000
        );
    }

    #[tokio::test]
    async fn edit_file_keeps_crlf_line_endings() {
        let (dir, ws) = setup();
        std::fs::write(dir.path().join("w.txt"), "one\r\ntwo\r\nthree\r\n").unwrap();
        let out = run(
            &EditFile::new(ws),
            json!({"path": "w.txt", "old_string": "one\ntwo", "new_string": "1\n2"}),
        )
        .await;
        assert!(out.success, "{}", out.output);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("w.txt")).unwrap(),
            "1\r\n2\r\nthree\r\n"
        );
    }

    #[tokio::test]
    async fn file_tools_rebind_to_a_new_workspace() {
        let (dir, ws) = setup();
        let other_dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f.txt"), "first\n").unwrap();
        std::fs::write(other_dir.path().join("f.txt"), "second\n").unwrap();
        let tool = ReadFile::new(ws);
        let rebound = tool.rebind_cwd(&Workspace::new(other_dir.path())).unwrap();
        assert!(
            run(&tool, json!({"path": "f.txt"}))
                .await
                .output
                .contains("first")
        );
        assert!(
            run(rebound.as_ref(), json!({"path": "f.txt"}))
                .await
                .output
                .contains("second")
        );
    }
}
