//! What a turn's checkpoint costs on a workspace of 10,000 files: the first one (every file
//! read, hashed and put in the store, which already holds them after the first iteration),
//! the next one when nothing changed (files whose size and time are unchanged keep the
//! previous hash unread), and one after a turn changed ten files.

// Reads what the test or benchmark made itself; the bounded readers are for the server.
#![allow(clippy::disallowed_methods)]

use std::hint::black_box;
use std::path::Path;

use agentd::checkpoint::{CheckpointStore, Limits, Snapshot};
use agentd::tools::workspace::Workspace;
use criterion::{Criterion, criterion_group, criterion_main};

/// Files in the workspace: a mid-sized repository's.
const FILES: usize = 10_000;

/// Writes `FILES` source-like files of about 2 KiB over 100 directories, each different (so
/// the store keeps one blob per file, as for a real repository).
fn fill(root: &Path) {
    let body = "fn main() { println!(\"hello\"); }\n".repeat(60);
    for i in 0..FILES {
        let dir = root.join(format!("src/m{:03}", i % 100));
        std::fs::create_dir_all(&dir).expect("directory");
        std::fs::write(
            dir.join(format!("f{i:05}.rs")),
            format!("// file {i}\n{body}"),
        )
        .expect("file");
    }
}

fn checkpoint(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    fill(dir.path());
    let workspace = Workspace::new(dir.path());
    let kept = tempfile::tempdir().expect("temp dir");
    let store = CheckpointStore::open(kept.path(), Limits::default()).expect("store");
    let mut group = c.benchmark_group("checkpoint_10k_files");
    group.sample_size(10);
    // The very first checkpoint writes every blob; later ones find them stored.
    let started = std::time::Instant::now();
    let previous = Snapshot::take(&workspace, None, &store);
    println!(
        "the first checkpoint, writing 10,000 blobs: {:?}",
        started.elapsed()
    );
    group.bench_function("first", |b| {
        b.iter(|| black_box(Snapshot::take(&workspace, None, &store)));
    });
    group.bench_function("unchanged", |b| {
        b.iter(|| black_box(Snapshot::take(&workspace, Some(&previous), &store)));
    });
    for i in 0..10 {
        let path = dir.path().join(format!("src/m{:03}/f{i:05}.rs", i % 100));
        std::fs::write(path, "changed\n").expect("change");
    }
    group.bench_function("ten_changed", |b| {
        b.iter(|| black_box(Snapshot::take(&workspace, Some(&previous), &store)));
    });
    group.finish();
}

criterion_group!(benches, checkpoint);
criterion_main!(benches);
