//! Costs of reading task output — tail, head and a 64 KiB page from the middle — on a 1 KiB log
//! and a 1 GiB one, to show that the cost follows the answer, not the size of the log.

// Reads what the test or benchmark made itself; the bounded readers are for the server.
#![allow(clippy::disallowed_methods)]

use std::fs::File;
use std::hint::black_box;
use std::io::{BufWriter, Write};
use std::path::Path;

use agentd::tasks::output::{OutputQuery, read_output};
use criterion::{Criterion, criterion_group, criterion_main};

/// Writes `size` bytes of numbered output lines to `path`, in 4 MiB blocks.
fn write_log(path: &Path, size: u64) {
    const BLOCK: usize = 4 * 1024 * 1024;
    let mut out = BufWriter::with_capacity(BLOCK, File::create(path).expect("create log"));
    let mut block = Vec::with_capacity(BLOCK + 128);
    let mut written = 0u64;
    let mut line = 0u64;
    while written < size {
        block.clear();
        while block.len() < BLOCK {
            line += 1;
            writeln!(
                block,
                "[{line:>9}] compiling crate_{} v0.1.{}",
                line % 97,
                line % 13
            )
            .expect("write to memory");
        }
        let take = block.len().min((size - written) as usize);
        out.write_all(&block[..take]).expect("write log");
        written += take as u64;
    }
    out.flush().expect("flush log");
}

/// Whether criterion will measure (`cargo bench`), rather than run each benchmark once as a test
/// (`cargo test --benches`), which only needs a small stand-in for the big log.
fn measuring() -> bool {
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    has("--bench") && !has("--test") && !has("--list")
}

fn task_output(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let big_size: u64 = if measuring() { 1 << 30 } else { 4 << 20 };
    let logs = [
        ("1KiB".to_owned(), dir.path().join("small.log"), 1024u64),
        (
            format!("{}MiB", big_size >> 20),
            dir.path().join("big.log"),
            big_size,
        ),
    ];
    for (_, path, size) in &logs {
        write_log(path, *size);
    }

    for (label, path, size) in &logs {
        let mut group = c.benchmark_group(format!("task_output/{label}"));
        let queries = [
            ("tail_50_lines", OutputQuery::Tail { lines: 50 }),
            ("head_50_lines", OutputQuery::Head { lines: 50 }),
            (
                "bytes_64KiB_middle",
                OutputQuery::Bytes {
                    offset: size / 2,
                    limit: 65_536,
                },
            ),
        ];
        for (name, query) in &queries {
            group.bench_function(*name, |b| {
                b.iter(|| read_output(black_box(path), black_box(query)).expect("read output"))
            });
        }
        group.finish();
    }
    // Dropping `dir` deletes the logs.
}

criterion_group!(benches, task_output);
criterion_main!(benches);
