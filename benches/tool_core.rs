//! Costs of the tool core's hot paths: dispatch, the argument size cap, session snapshots,
//! and what the disk accounting adds to a file write.

// Reads what the test or benchmark made itself; the bounded readers are for the server.
#![allow(clippy::disallowed_methods)]

use std::hint::black_box;
use std::sync::Arc;

use agentd::tools::args::estimate_json_size;
use agentd::tools::{Effects, Tool, ToolContext, ToolError, ToolMeta, ToolRegistry, ToolResult};
use async_trait::async_trait;
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};

/// A tool that does nothing, so only the registry's own work is measured.
struct Noop(ToolMeta);

impl Noop {
    fn new(name: String) -> Self {
        let schema = json!({
            "type": "object",
            "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["path"]
        });
        Self(ToolMeta::new(name, "does nothing", schema, Effects::NONE))
    }
}

#[async_trait]
impl Tool for Noop {
    fn meta(&self) -> &ToolMeta {
        &self.0
    }
    async fn call(&self, _ctx: &ToolContext, _args: &Value) -> Result<ToolResult, ToolError> {
        Ok(ToolResult::ok(""))
    }
}

fn registry(tools: usize) -> ToolRegistry {
    let mut registry = ToolRegistry::default();
    for i in 0..tools {
        registry
            .register(Arc::new(Noop::new(format!("tool_{i:02}"))))
            .expect("valid schema");
    }
    for base in ["tool_00", "tool_01", "tool_02"] {
        registry.pin_base_tool(base);
    }
    registry
}

/// About 1 MiB of mixed JSON: strings needing escapes, integers, floats, nesting.
fn large_value() -> Value {
    let rows: Vec<Value> = (0..8_000)
        .map(|i| {
            json!({
                "id": i,
                "score": i as f64 * 1.000_37,
                "line": format!("line {i}\twith \"quotes\" and a \\ backslash\n"),
                "tags": ["alpha", "beta", i % 7],
                "ok": i % 2 == 0,
            })
        })
        .collect();
    json!({ "path": "big.json", "rows": rows })
}

fn dispatch(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let mut registry = registry(40);
    let ctx = ToolContext::detached(".");
    let args = json!({"path": "src/lib.rs", "limit": 20});
    c.bench_function("execute_with_context/noop", |b| {
        b.iter(|| {
            let outcome = runtime.block_on(registry.execute_with_context(&ctx, "tool_17", &args));
            black_box(outcome.expect("noop succeeds"));
        })
    });
}

/// A `write_file` call carrying about 1 MiB of source text: the shape large arguments take.
fn source_file_value() -> Value {
    let line = "    let value = format!(\"{}\\t{}\", name, \"x\"); // keep \\ and \"quotes\"\n";
    json!({ "path": "src/generated.rs", "content": line.repeat(1024 * 1024 / line.len()) })
}

fn argument_size(c: &mut Criterion) {
    for (shape, value) in [
        ("source_file", source_file_value()),
        ("mixed", large_value()),
    ] {
        let size = serde_json::to_vec(&value).expect("serialises").len();
        assert_eq!(estimate_json_size(&value), size);
        let mut group = c.benchmark_group(format!("args_size/{shape}_{size}_bytes"));
        group.bench_function("estimate_json_size", |b| {
            b.iter(|| black_box(estimate_json_size(black_box(&value))))
        });
        group.bench_function("serde_json_to_vec_len", |b| {
            b.iter(|| black_box(serde_json::to_vec(black_box(&value)).map(|v| v.len())))
        });
        group.finish();
    }
}

fn snapshot(c: &mut Criterion) {
    let parent = registry(40);
    c.bench_function("snapshot_excluding/40_tools", |b| {
        b.iter(|| black_box(parent.snapshot_excluding(black_box(&["group:delegated"]))))
    });
}

/// A 4 KiB `Workspace::write` over the same file, uncharged and charged to a user's disk
/// account (quota and free-space reserve both on, so each write reads the replaced file's
/// size and `statvfs`).
fn disk_accounting(c: &mut Criterion) {
    use agentd::disk_quota::{DiskQuotas, Statvfs};
    use agentd::tools::workspace::Workspace;
    let contents = vec![b'x'; 4096];
    let mut group = c.benchmark_group("workspace_write_4k");
    let plain_dir = tempfile::tempdir().unwrap();
    let plain = Workspace::new(plain_dir.path());
    group.bench_function("uncharged", |b| {
        b.iter(|| {
            plain.write(
                "write_file",
                std::path::Path::new("f"),
                black_box(&contents),
            )
        })
    });
    let charged_dir = tempfile::tempdir().unwrap();
    let free = Arc::new(Statvfs::new(vec![charged_dir.path().to_path_buf()]));
    let quotas = DiskQuotas::new(1024, 512, free).unwrap();
    let charged = Workspace::charged(
        charged_dir.path(),
        "",
        None,
        Arc::default(),
        Some(quotas.user(None, charged_dir.path())),
    );
    group.bench_function("charged", |b| {
        b.iter(|| {
            charged.write(
                "write_file",
                std::path::Path::new("f"),
                black_box(&contents),
            )
        })
    });
    group.finish();
}

criterion_group!(benches, dispatch, argument_size, snapshot, disk_accounting);
criterion_main!(benches);
