//! The module arrows point one way: http → session → agent → cluster → {tasks, tools, llm} →
//! store. A source file may name a module only below its own; an import that points up or
//! sideways into a higher layer fails here with the file and the line. The sources are parsed
//! as Rust (syn): `use` trees, paths in code and types, `super::` and `self::` resolved against
//! the file's place, and `crate::` inside macro calls; a top-level module the table does not
//! rank fails the check rather than escaping it.

use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// Top-level modules from the top (0) down. Modules of one rank may not import each other.
const LAYERS: &[(&str, u32)] = &[
    ("server", 0),
    ("http", 1),
    ("config", 2),
    ("session", 3),
    ("agent", 4),
    ("cluster", 5),
    ("tasks", 7),
    // The tools beside the framework: MCP and plugins run their programs as built-ins do.
    ("mcp", 8),
    ("plugin", 8),
    ("builtin", 9),
    ("checkpoint", 9),
    ("tools", 10),
    ("sandbox", 11),
    ("llm", 12),
    ("store", 13),
    ("error_kind", 13),
    ("fs_safe", 13),
    ("disk_quota", 13),
    ("secret", 13),
    ("telemetry", 13),
    // Below the store, which trims the heap once its caches are given back.
    ("heap", 14),
    // Counted into from every layer, it names none of them.
    ("metrics", 14),
    // Locked from every layer, it names none of them.
    ("mutex", 14),
    // Every layer reads through it; it names none of them.
    ("capped_read", 14),
    // Held by the server for its life; it names no other module.
    ("data_dir", 14),
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

/// The module path of a source file under `src/`: `session/actor/turns.rs` is
/// `[session, actor, turns]`, `tools/mod.rs` is `[tools]`.
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .components()
        .filter_map(|c| c.as_os_str().to_str().map(str::to_string))
        .collect();
    if let Some(last) = parts.pop() {
        let stem = last.trim_end_matches(".rs");
        if stem != "mod" {
            parts.push(stem.to_string());
        }
    }
    parts
}

/// A crate module named by a path, with the line it is on.
#[derive(Debug, PartialEq)]
struct Named {
    module: String,
    line: usize,
}

/// Collects the top-level modules a file's code names.
struct Arrows {
    /// The module the code being read is in (the file's path, then inline `mod`s).
    at: Vec<String>,
    named: Vec<Named>,
}

impl Arrows {
    /// Resolves a path's leading segments (`crate`, `self`, `super`…) to the top-level
    /// module it reaches, if it reaches one of this crate's.
    fn resolve(&mut self, segments: &[String], line: usize) {
        let mut place = self.at.clone();
        let mut rest = segments;
        match rest.first().map(String::as_str) {
            Some("crate") => {
                place.clear();
                rest = &rest[1..];
            }
            Some("self") => rest = &rest[1..],
            Some("super") => {
                while rest.first().map(String::as_str) == Some("super") {
                    place.pop();
                    rest = &rest[1..];
                }
            }
            // A plain path names an item in scope or an external crate: not an arrow.
            _ => return,
        }
        let module = match place.first() {
            Some(top) => top.clone(),
            None => match rest.first() {
                Some(top) => top.clone(),
                None => return,
            },
        };
        self.named.push(Named { module, line });
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.use_tree(prefix, &path.tree);
                prefix.pop();
            }
            syn::UseTree::Name(name) => {
                prefix.push(name.ident.to_string());
                self.resolve(&prefix.clone(), name.ident.span().start().line);
                prefix.pop();
            }
            syn::UseTree::Rename(rename) => {
                prefix.push(rename.ident.to_string());
                self.resolve(&prefix.clone(), rename.ident.span().start().line);
                prefix.pop();
            }
            syn::UseTree::Glob(glob) => {
                self.resolve(&prefix.clone(), glob.star_token.spans[0].start().line);
            }
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }

    /// `crate::x` (and `super::`/`self::` paths) inside a macro call's tokens, which syn
    /// leaves unparsed.
    fn tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        for (i, tree) in trees.iter().enumerate() {
            match tree {
                TokenTree::Group(group) => self.tokens(group.stream()),
                TokenTree::Ident(ident) if ident == "crate" || ident == "super" => {
                    // `$crate` is the macro's own crate, not an arrow of this file.
                    let dollar =
                        i > 0 && matches!(&trees[i - 1], TokenTree::Punct(p) if p.as_char() == '$');
                    let follows = |k: usize| matches!(trees.get(k), Some(TokenTree::Punct(p)) if p.as_char() == ':');
                    if dollar || !(follows(i + 1) && follows(i + 2)) {
                        continue;
                    }
                    let mut segments = vec![ident.to_string()];
                    let mut k = i + 3;
                    while let Some(TokenTree::Ident(next)) = trees.get(k) {
                        segments.push(next.to_string());
                        if !(follows(k + 1) && follows(k + 2)) {
                            break;
                        }
                        k += 3;
                    }
                    self.resolve(&segments, ident.span().start().line);
                }
                _ => {}
            }
        }
    }
}

impl<'ast> Visit<'ast> for Arrows {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if item.content.is_some() {
            self.at.push(item.ident.to_string());
            syn::visit::visit_item_mod(self, item);
            self.at.pop();
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if let Some(first) = path.segments.first() {
            self.resolve(&segments, first.ident.span().start().line);
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        self.tokens(mac.tokens.clone());
    }
}

/// The top-level modules `code` (the file at `module`) names, with their lines.
fn named_modules(module: &[String], code: &str) -> Vec<Named> {
    let file = syn::parse_file(code).expect("the source parses as Rust");
    let mut arrows = Arrows {
        at: module.to_vec(),
        named: Vec::new(),
    };
    arrows.visit_file(&file);
    arrows.named
}

#[test]
fn imports_point_only_down_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut upward = Vec::new();
    let mut unranked = Vec::new();
    let mut checked = 0;
    for file in &files {
        let relative = file.strip_prefix(&src).expect("under src");
        let path = module_path(relative);
        let module = path.first().cloned().expect("module");
        // lib.rs, main.rs and the binaries sit above every module.
        if ["lib", "main", "bin"].contains(&module.as_str()) {
            continue;
        }
        let Some(own) = rank(&module) else {
            unranked.push(relative.display().to_string());
            continue;
        };
        checked += 1;
        let text = std::fs::read_to_string(file).expect("readable source");
        for named in named_modules(&path, &text) {
            let Some(theirs) = rank(&named.module) else {
                if !["lib", "main"].contains(&named.module.as_str()) {
                    unranked.push(format!(
                        "{}:{}: names crate::{}",
                        relative.display(),
                        named.line,
                        named.module
                    ));
                }
                continue;
            };
            if named.module != module && theirs <= own {
                upward.push(format!(
                    "{}:{}: {module} names crate::{}",
                    relative.display(),
                    named.line,
                    named.module
                ));
            }
        }
    }
    assert!(checked > 50, "only {checked} files were checked");
    assert!(
        unranked.is_empty(),
        "modules the layer table does not rank (add them to LAYERS):\n{}",
        unranked.join("\n")
    );
    assert!(
        upward.is_empty(),
        "imports that point up or sideways:\n{}",
        upward.join("\n")
    );
}

#[test]
fn every_kind_of_arrow_is_seen() {
    let at = |path: &str| -> Vec<String> { path.split('/').map(str::to_string).collect() };
    let modules = |module: &str, code: &str| -> Vec<String> {
        let mut named: Vec<String> = named_modules(&at(module), code)
            .into_iter()
            .map(|n| n.module)
            .collect();
        named.dedup();
        named
    };
    assert_eq!(
        modules(
            "tools/registry",
            "use crate::{agent::call, tools::{ToolResult, ToolEvent}, store};"
        ),
        ["agent", "tools", "store"]
    );
    // Paths in code and types, and in macro calls; `$crate` and external crates are not arrows.
    assert_eq!(
        modules(
            "llm/transport",
            "fn f(x: crate::session::Caller) { let u = \"http://x\"; crate::http::go(); \
             tracing::info!(a = %crate::agent::X); m!($crate::tools::x()); }"
        ),
        ["session", "http", "agent"]
    );
    // `super::` climbs from the file's place (and from inline modules).
    assert_eq!(
        modules("tools/builtin/shell", "use super::super::Tool;"),
        ["tools"]
    );
    assert_eq!(
        modules("store", "mod inner { use super::super::session::X; }"),
        ["session"]
    );
    assert_eq!(
        modules("session/actor/turns", "use self::x::Y;"),
        ["session"]
    );
    // The check itself must see the arrows it is about.
    assert!(rank("agent") > rank("session"));
    assert!(rank("tools") > rank("agent") && rank("llm") > rank("tools"));
    assert!(rank("store") > rank("llm"));
}
