//! The module arrows point one way: http → session → agent → cluster → {tasks, tools, llm} →
//! store. A source file may name `crate::<module>` only for a module below its own; an import
//! that points up or sideways into a higher layer fails here with the file and the line.

use std::path::{Path, PathBuf};

/// Top-level modules from the top (0) down. Modules of one rank may not import each other.
const LAYERS: &[(&str, u32)] = &[
    ("server", 0),
    ("http", 1),
    ("config", 2),
    ("session", 3),
    ("agent", 4),
    ("cluster", 5),
    ("metrics", 6),
    ("tasks", 7),
    ("tools", 8),
    ("sandbox", 9),
    ("llm", 10),
    ("store", 11),
    ("fs_safe", 11),
    ("heap", 11),
    ("secret", 11),
    ("telemetry", 11),
];

fn rank(module: &str) -> Option<u32> {
    LAYERS
        .iter()
        .find(|(name, _)| *name == module)
        .map(|(_, rank)| *rank)
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("source directory") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}

/// The top-level modules a piece of code names through `crate::`, including every member of
/// a grouped `use crate::{a::x, b::{y, z}}`.
fn named_modules(code: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        // `agentd::crate::` does not occur; `$crate::` in macros is not ours to judge.
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && (c.is_alphanumeric() || c == '_') => {
                        let name: String = group[i..]
                            .chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect();
                        names.push(name);
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            names.push(
                rest.chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect(),
            );
        }
    }
    names
}

#[test]
fn imports_point_only_down_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut upward = Vec::new();
    let mut checked = 0;
    for file in &files {
        let relative = file.strip_prefix(&src).expect("under src");
        let module = relative
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .map(|name| name.trim_end_matches(".rs").to_string())
            .expect("module");
        let Some(own) = rank(&module) else {
            // lib.rs, main.rs and the binaries sit above every module.
            continue;
        };
        checked += 1;
        let text = std::fs::read_to_string(file).expect("readable source");
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for named in named_modules(code) {
                let Some(theirs) = rank(&named) else { continue };
                if named != module && theirs <= own {
                    upward.push(format!(
                        "{}:{}: {module} names crate::{named}",
                        relative.display(),
                        number + 1
                    ));
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} files were checked");
    assert!(
        upward.is_empty(),
        "imports that point up or sideways:\n{}",
        upward.join("\n")
    );
}

#[test]
fn grouped_imports_are_read_member_by_member() {
    assert_eq!(
        named_modules("use crate::{agent::call, tools::{ToolResult, ToolEvent}, store};"),
        ["agent", "tools", "store"]
    );
    assert_eq!(
        named_modules("let x = crate::session::stamp(); $crate::tools::x();"),
        ["session"]
    );
    // The check itself must see the arrows it is about.
    assert!(rank("agent") > rank("session"));
    assert!(rank("tools") > rank("agent") && rank("llm") > rank("tools"));
    assert!(rank("store") > rank("llm"));
}
