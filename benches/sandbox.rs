//! What the sandbox costs a command: `shell "true"` through the real `shell` tool, sandboxed
//! (every layer this kernel allows) and with `[sandbox] mode = "off"`, interleaved in one run,
//! with p50, p90 and p99 of each and the difference at p50.
//!
//! `cargo bench --bench sandbox` runs 400 commands of each kind; under `cargo test` it runs
//! five, to prove it works.

// Reads what the test or benchmark made itself; the bounded readers are for the server.
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentd::builtin::shell::Shell;
use agentd::config::{SandboxConfig, SandboxMode};
use agentd::sandbox::Sandbox;
use agentd::tools::{Tool, ToolContext, Workspace};
use serde_json::json;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn micros(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

fn main() {
    let benchmarking = std::env::args().any(|a| a == "--bench");
    let runs = if benchmarking { 400 } else { 5 };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let root = dir.path().join("workspace");
    std::fs::create_dir_all(&root).expect("workspace");
    let settings = SandboxConfig {
        launcher: Some(Path::new(env!("CARGO_BIN_EXE_agentd-sandbox")).to_path_buf()),
        ..SandboxConfig::default()
    };
    assert_eq!(settings.mode, SandboxMode::WorkspaceWrite);
    let sandbox = runtime
        .block_on(Sandbox::start(&settings, &data, None))
        .expect("the sandbox starts")
        .expect("the sandbox is on");
    let session = sandbox.for_session("bench", &root);
    let confined = Shell::new(Workspace::anchored(
        &root,
        "",
        Some(session),
        Arc::default(),
    ));
    let open = Shell::new(Workspace::new(&root));
    let args = json!({"command": "true"});
    let ctx = ToolContext::detached(&root);

    let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..runs {
        for (slot, tool) in [(0, &open), (1, &confined)] {
            let started = Instant::now();
            let result = runtime
                .block_on(tool.call(&ctx, &args))
                .expect("shell runs");
            times[slot].push(started.elapsed());
            assert!(result.success, "{}", result.output);
        }
    }
    for series in &mut times {
        series.sort();
    }
    let layers = sandbox.report().layers.join(", ");
    println!("shell \"true\", {runs} runs each, interleaved; sandbox layers: {layers}");
    println!("{:<12} {:>10} {:>10} {:>10}", "mode", "p50", "p90", "p99");
    for (name, series) in [("off", &times[0]), ("sandboxed", &times[1])] {
        println!(
            "{:<12} {:>10} {:>10} {:>10}",
            name,
            micros(percentile(series, 0.5)),
            micros(percentile(series, 0.9)),
            micros(percentile(series, 0.99)),
        );
    }
    let added = percentile(&times[1], 0.5).saturating_sub(percentile(&times[0], 0.5));
    println!("added by the sandbox at p50: {}", micros(added));
}
