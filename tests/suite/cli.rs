//! The `agentd` binary: start-up failures are one line and exit code 2; SIGTERM stops it cleanly.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

fn agentd() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_agentd"));
    // The test runner's own environment must not configure the server under test.
    for (name, _) in std::env::vars() {
        if name.starts_with("AGENTD_") || name == "DATABASE_URL" || name == "OPENAI_API_KEY" {
            command.env_remove(name);
        }
    }
    command
}

/// Runs the binary to completion; returns exit code and stderr.
fn run(args: &[&str], dir: &std::path::Path) -> (Option<i32>, String) {
    let output = agentd()
        .args(args)
        .current_dir(dir)
        .output()
        .expect("agentd runs");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn start_up_failures_are_one_line_and_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bad.toml"), "[server]\nbind = 12\n").unwrap();
    std::fs::write(dir.path().join("a-file"), "").unwrap();
    let cases: &[&[&str]] = &[
        &["serve", "--config", "bad.toml"],
        &["serve", "--config", "missing.toml"],
        &[
            "serve",
            "--database-url",
            "postgres://root@127.0.0.1:1/none",
        ],
        &["serve", "--database-url", "mysql://x"],
        &["serve", "--workspace", "a-file/ws", "--bind", "127.0.0.1:0"],
    ];
    for args in cases {
        let (code, stderr) = run(args, dir.path());
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        let lines: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("agentd:"))
            .collect();
        assert_eq!(lines.len(), 1, "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

#[test]
fn sigterm_stops_the_server_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = agentd()
        .args(["--bind", "127.0.0.1:0"])
        .current_dir(dir.path())
        .env("AGENTD_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .expect("agentd starts");
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    // Block on the log until the server says it listens; the read ends if the process dies.
    let listening = lines
        .by_ref()
        .map_while(Result::ok)
        .any(|line| line.contains("listening"));
    assert!(listening, "agentd never started listening");
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(dir.path().join("data/agentd.db").exists());
    assert!(dir.path().join("workspace").is_dir());
}

#[test]
fn both_binaries_launch_confined_commands() {
    for launcher in [
        env!("CARGO_BIN_EXE_agentd"),
        env!("CARGO_BIN_EXE_agentd-sandbox"),
    ] {
        let probe = Command::new(launcher)
            .args(["sandbox-exec", "--probe"])
            .output()
            .expect("the launcher runs");
        let report: serde_json::Value = serde_json::from_slice(&probe.stdout).unwrap();
        assert!(report["landlock_abi"].is_number(), "{launcher}: {report}");
        // A spec that grants nothing but the system: the workspace-less command runs, and a
        // file outside is refused.
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside.txt");
        std::fs::write(&outside, "outside").unwrap();
        let spec = serde_json::json!({
            "read": ["/usr", "/bin", "/lib", "/lib64", "/etc"],
            "write": [], "devices": ["/dev/null"], "tmp": null, "cwd": "/",
            "network": false, "namespaces": false, "net_namespace": false,
            "mount_proc": false, "landlock": report["landlock_abi"].as_i64() > Some(0),
            "seccomp": false, "cgroup_procs": null, "nproc": null,
        });
        let output = Command::new(launcher)
            .args(["sandbox-exec", &spec.to_string(), "sh", "-c"])
            .arg(format!("echo ran; cat {}", outside.display()))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(stdout.contains("ran"), "{launcher}: {stdout}");
        if spec["landlock"] == true {
            assert!(!stdout.contains("outside"), "{launcher}: {stdout}");
        }
    }
}
