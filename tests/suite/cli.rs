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
            "seccomp": false, "cgroup_procs": [], "nproc": null,
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

#[test]
fn flags_before_the_subcommand_are_refused_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    // Before: `--bind` went to the top-level flags and `serve` ran with its own, unset ones.
    let (code, stderr) = run(&["--bind", "127.0.0.1:1", "serve"], dir.path());
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--bind"), "{stderr}");
    // An environment variable is not a flag: it reaches `serve` as before (here, a config file
    // that does not exist, so start-up fails on it, not on the command line).
    let output = agentd()
        .args(["serve"])
        .env("AGENTD_BIND", "127.0.0.1:0")
        .env("AGENTD_CONFIG", "missing.toml")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("missing.toml"), "{stderr}");
    // `--help` names the environment variables that are not flags.
    let help = agentd().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for name in [
        "AGENTD_LOG",
        "AGENTD_LOG_FORMAT",
        "AGENTD_LLM_API_KEY",
        "OPENAI_API_KEY",
    ] {
        assert!(help.contains(name), "{name} missing from --help:\n{help}");
    }
    // ...and the defaults the flags fall back to (not clap defaults, which would override the
    // file, so they are part of the help text).
    for default in [
        "[default: 127.0.0.1:8080]",
        "[default: data]",
        "[default: workspace]",
        "[default: sqlite://<data dir>/agentd.db]",
    ] {
        assert!(
            help.contains(default),
            "{default} missing from --help:\n{help}"
        );
    }
}

#[test]
fn check_config_prints_the_effective_configuration_as_toml_with_secrets_masked() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("agentd.toml"),
        "[server]\nauth_token = \"tok-secret-123\"\n\
         [[server.users]]\nname = \"alice\"\ntoken = \"tok-alice-456\"\n\
         [tools]\nmax_active = 12\n\
         [[plugins]]\nname = \"lint\"\ndescription = \"d\"\ncommand = \"/bin/true\"\n",
    )
    .unwrap();
    let check = |config: &str| {
        let output = agentd()
            .args([
                "check-config",
                "--config",
                config,
                "--bind",
                "127.0.0.1:9911",
            ])
            .env("AGENTD_LLM_API_KEY", "sk-secret-789")
            .current_dir(dir.path())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(output.status.success(), "{stdout}");
        stdout
    };
    let stdout = check("agentd.toml");
    for secret in ["tok-secret-123", "tok-alice-456", "sk-secret-789"] {
        assert!(!stdout.contains(secret), "{secret} shown:\n{stdout}");
    }
    let table: toml::Table = toml::from_str(&stdout).expect("check-config prints TOML");
    assert_eq!(
        table["tools"]["max_active"].as_integer(),
        Some(12),
        "the file's value"
    );
    assert_eq!(
        table["server"]["bind"].as_str(),
        Some("127.0.0.1:9911"),
        "the flag's value"
    );
    assert_eq!(table["server"]["auth_token"].as_str(), Some("[redacted]"));
    assert_eq!(
        table["server"]["users"][0]["token"].as_str(),
        Some("[redacted]")
    );
    assert_eq!(
        table["tools"]["idle_threshold"].as_integer(),
        Some(5),
        "a default"
    );
    assert_eq!(
        table["plugins"][0]["timeout_ms"].as_integer(),
        Some(600_000)
    );
    // Relative directories are shown as the absolute paths they were resolved to.
    let cwd = dir.path().canonicalize().unwrap();
    assert!(
        stdout.contains(&format!(
            "the database is sqlite://{}",
            cwd.join("data/agentd.db").display()
        )),
        "{stdout}"
    );
    assert_eq!(
        table["server"]["workspace"].as_str(),
        Some(cwd.join("workspace").to_str().unwrap())
    );
    assert!(
        stdout.contains("API key comes only from the environment: set"),
        "{stdout}"
    );
    // What it prints reads back as the same configuration.
    std::fs::write(dir.path().join("effective.toml"), &stdout).unwrap();
    let body = |text: &str| {
        text.lines()
            .filter(|line| !line.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(body(&check("effective.toml")), body(&stdout));
    // A bad file is the same one line and exit code 2 as for `serve`.
    std::fs::write(dir.path().join("bad.toml"), "[tools]\nmax_actve = 3\n").unwrap();
    let (code, stderr) = run(&["check-config", "--config", "bad.toml"], dir.path());
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("max_actve"), "{stderr}");
}

#[test]
fn migrate_brings_the_database_up_to_date_and_exits() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("agentd.db");
    let url = format!("sqlite://{}", db.display());
    let output = agentd()
        .args(["migrate", "--database-url", &url])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("sqlite database is up to date"), "{stdout}");
    assert!(db.exists(), "the database was created");
}

#[tokio::test]
async fn a_log_that_cannot_be_written_never_breaks_a_request() {
    let dir = tempfile::tempdir().unwrap();
    // A port of its own: with stderr on /dev/full the server cannot say where it listens.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
        .current_dir(dir.path())
        .env("AGENTD_BIND", format!("127.0.0.1:{port}"))
        .env("AGENTD_LOG", "debug")
        .stderr(full)
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/healthz");
    let deadline = std::time::Instant::now() + crate::support::WAIT;
    let healthy = loop {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the server died writing its log"
        );
        match reqwest::get(&url).await {
            Ok(response) => break response.status().as_u16(),
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(err) => panic!("no answer: {err}"),
        }
    };
    assert_eq!(healthy, 200);
    // A request that logs (a session, a tool call, an error) is answered too.
    let (stream, _) = tokio_tungstenite::connect_async(format!("ws://127.0.0.1:{port}/api/ws"))
        .await
        .unwrap();
    let mut ws = crate::support::WsClient::from_stream(stream);
    let session = ws.open().await;
    let listed = ws
        .invoke(&session, "list_dir", serde_json::json!({"path": "."}))
        .await;
    assert_eq!(listed["success"], true, "{listed}");
    let (_, missing) = ws
        .call(
            "tool/invoke",
            serde_json::json!({"session_id": session, "name": "nope", "arguments": {}}),
        )
        .await;
    assert_eq!(missing["error"]["data"]["kind"], "unknown_tool");
    assert!(child.try_wait().unwrap().is_none());
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test]
async fn a_backup_taken_under_load_opens_and_replays() {
    let app = crate::support::TestApp::spawn().await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    // Calls keep writing while the copy is made.
    let load = tokio::spawn({
        let session = session.clone();
        async move {
            for i in 0..300 {
                let path = format!("f{i}.txt");
                ws.invoke(
                    &session,
                    "write_file",
                    serde_json::json!({"path": path, "content": "x"}),
                )
                .await;
            }
        }
    });
    let file = app.dir.path().join("copy.db");
    let data_dir = app.dir.path().join("data");
    let output = tokio::task::spawn_blocking({
        let file = file.clone();
        move || {
            agentd()
                .arg("backup")
                .arg(&file)
                .arg("--data-dir")
                .arg(&data_dir)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{said} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(said.contains("wrote a copy"), "{said}");
    load.await.unwrap();

    // The copy is a store of its own: the session is there and its events replay in order,
    // every one up to the last the copy holds.
    let copy = agentd::store::connect(&format!("sqlite://{}", file.display()))
        .await
        .unwrap();
    let row = copy
        .get_session(&session)
        .await
        .unwrap()
        .expect("the session");
    let events = copy.events_after(&session, 0, 100_000).await.unwrap();
    assert_eq!(events.len() as i64, row.last_seq);
    assert!(events.iter().zip(1..).all(|(e, seq)| e.seq == seq));
    copy.close().await;

    // An existing file is never overwritten, and PostgreSQL is pointed at pg_dump.
    let again = agentd()
        .arg("backup")
        .arg(&file)
        .arg("--data-dir")
        .arg(app.dir.path().join("data"))
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists already"));
    let postgres = agentd()
        .args([
            "backup",
            "/tmp/never.db",
            "--database-url",
            "postgres://u@127.0.0.1:1/x",
        ])
        .output()
        .unwrap();
    assert_eq!(postgres.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&postgres.stderr).contains("pg_dump"));
}

#[test]
fn gc_applies_the_retention_policy_now_and_says_what_it_deleted() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("agentd.toml"),
        "[retention]\nidle_session_days = 30\nevents_days = 7\n",
    )
    .unwrap();
    let output = agentd()
        .args(["gc", "--config", "agentd.toml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{said}");
    assert_eq!(
        said.trim(),
        "deleted 0 idle sessions, 0 events, 0 tasks' output and 0 bytes of checkpoints"
    );
    // A bad key is one clear line and exit code 2, as for serve.
    std::fs::write(dir.path().join("bad.toml"), "[retention]\nevent_days = 7\n").unwrap();
    let bad = agentd()
        .args(["gc", "--config", "bad.toml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("event_days"));
}

/// Runs `agentd exec ARGS` against `mock` with a config in `dir`; answers the exit code,
/// stdout and stderr.
async fn exec(
    dir: &std::path::Path,
    mock: &crate::support::mock_llm::MockLlm,
    extra_toml: &str,
    args: &[&str],
) -> (Option<i32>, String, String) {
    let config = dir.join("exec.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ndata_dir = \"{0}/data\"\nworkspace = \"{0}/ws\"\n[llm]\nbase_url = \"{1}\"\n\
             model = \"test-model\"\n{extra_toml}",
            dir.display(),
            mock.base_url()
        ),
    )
    .unwrap();
    let mut command = agentd();
    command
        .arg("exec")
        .arg("--config")
        .arg(&config)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null());
    let output = tokio::task::spawn_blocking(move || command.output().expect("agentd runs"))
        .await
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn exec_runs_one_task_and_its_exit_code_says_how_it_ended() {
    use crate::support::mock_llm::{MockLlm, Reply, Script};
    use serde_json::{Value, json};
    let dir = tempfile::tempdir().unwrap();

    // --json: a session line, every notification, the turn's end last; exit 0.
    let mock = MockLlm::start(Script::always(Reply::text(&["hello ", "there"]))).await;
    let (code, stdout, stderr) = exec(dir.path(), &mock, "", &["--json", "say hi"]).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["type"], "session");
    assert_eq!(lines[0]["schema_version"], 1);
    assert!(lines[0]["session_id"].is_string());
    let methods: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l["method"].as_str().unwrap())
        .collect();
    assert_eq!(methods.first(), Some(&"turn/started"), "{methods:?}");
    assert_eq!(methods.last(), Some(&"turn/completed"), "{methods:?}");
    assert!(methods.contains(&"message/delta"));
    assert_eq!(lines.last().unwrap()["params"]["reason"], "completed");
    // Without --json: the answer on stdout, the summary on stderr.
    let (code, stdout, stderr) = exec(dir.path(), &mock, "", &["say hi"]).await;
    assert_eq!(
        (code, stdout.as_str()),
        (Some(0), "hello there\n"),
        "{stderr}"
    );
    assert!(
        stderr.contains("completed") && stderr.contains("tokens"),
        "{stderr}"
    );

    // --output-schema: a wrong answer is asked for once more; the valid one is printed.
    let schema = dir.path().join("schema.json");
    std::fs::write(
        &schema,
        json!({"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}})
            .to_string(),
    )
    .unwrap();
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::text(&["All done, it worked."]),
        Reply::text(&["{\"ok\": true}"]),
    ]))
    .await;
    let schema_arg = schema.to_str().unwrap();
    let (code, stdout, stderr) = exec(
        dir.path(),
        &mock,
        "",
        &["--output-schema", schema_arg, "check it"],
    )
    .await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "{\"ok\":true}");
    let retry = mock.requests()[1].to_string();
    assert!(retry.contains("does not validate"), "{retry}");
    assert!(mock.requests()[0].to_string().contains("JSON Schema"));
    // Twice wrong: exit 1.
    let mock = MockLlm::start(Script::always(Reply::text(&["still prose"]))).await;
    let (code, _, stderr) = exec(
        dir.path(),
        &mock,
        "",
        &["--output-schema", schema_arg, "check it"],
    )
    .await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("does not validate"), "{stderr}");

    // The model refuses: the turn fails, exit 1.
    let mock = MockLlm::start(Script::always(Reply::error(
        400,
        json!({"error": {"message": "bad request", "type": "invalid_request_error"}}),
    )))
    .await;
    let (code, _, stderr) = exec(dir.path(), &mock, "", &["go"]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("turn failed"), "{stderr}");

    // Over budget before the first call: exit 3.
    let mock = MockLlm::start(Script::always(Reply::text(&["never"]))).await;
    let budget = "[budget]\nsession_usd = 0.000001\n[llm.pricing.\"test-model\"]\n\
                  input_per_mtok = 1000.0\noutput_per_mtok = 1000.0\n";
    let (code, _, stderr) = exec(dir.path(), &mock, budget, &["go"]).await;
    assert_eq!(code, Some(3), "{stderr}");
    assert_eq!(mock.request_count(), 0);

    // Bad usage: exit 2 with one line.
    let (code, _, stderr) = exec(
        dir.path(),
        &mock,
        "",
        &["--output-schema", "missing.json", "x"],
    )
    .await;
    assert_eq!(code, Some(2), "{stderr}");
    let (code, _, stderr) = exec(dir.path(), &mock, "", &["  "]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("needs a prompt"), "{stderr}");
}

/// Runs the binary as `args` say with stdin closed, killed if it has not ended within the
/// tests' wait (a second server that started would never end); answers exit code and stderr.
async fn run_briefly(args: &[&str]) -> (Option<i32>, String) {
    let mut command = tokio::process::Command::from(agentd());
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let output = tokio::time::timeout(crate::support::WAIT, command.output())
        .await
        .unwrap_or_else(|_| panic!("{args:?} is still running: it did not stop at the lock"))
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_second_process_on_a_live_servers_data_dir_exits_2_naming_it_and_changes_nothing() {
    use crate::support::mock_llm::{MockLlm, Reply, Script};
    use serde_json::{Value, json};
    use std::sync::Arc;
    let release = Arc::new(tokio::sync::Notify::new());
    let mock = MockLlm::start(Script::always(Reply::hold(
        &["working"],
        Arc::clone(&release),
        &[" done"],
    )))
    .await;
    let base_url = mock.base_url();
    let app = crate::support::TestApp::spawn_with(move |c| {
        c.llm.base_url = Some(base_url);
        c.llm.model = Some("test-model".into());
    })
    .await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    // A background task running, and a turn running: what a second start-up's recovery
    // would end.
    let started = ws
        .invoke(
            &session,
            "shell",
            json!({"command": "sleep 600", "run_in_background": true}),
        )
        .await;
    assert_eq!(started["success"], true, "{started}");
    let (_, answer) = ws
        .call(
            "turn/start",
            json!({"session_id": session, "input": [{"kind": "text", "text": "go"}]}),
        )
        .await;
    assert!(answer.get("error").is_none(), "{answer}");
    ws.notification("message/delta").await;

    let tasks_path = format!("/api/sessions/{session}/tasks");
    let snapshot = async || {
        (
            app.replay(&session).await,
            app.get_json(&tasks_path, None).await,
            app.get_json("/api/sessions", None).await,
        )
    };
    let before = snapshot().await;
    assert_eq!(before.1["tasks"][0]["state"], "running", "{}", before.1);

    let dir = app.dir.path();
    let config = dir.join("second.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nbind = \"127.0.0.1:0\"\ndata_dir = \"{0}/data\"\nworkspace = \"{0}/workspace\"\n\
             [llm]\nbase_url = \"{1}\"\nmodel = \"test-model\"\n",
            dir.display(),
            mock.base_url()
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let empty = dir.join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let held = format!("data directory in use by pid {}", std::process::id());
    let cases: &[(&[&str], &str)] = &[
        (&["serve", "--config", config], ""),
        (&["--config", config], ""),
        (&["gc", "--config", config], ""),
        (&["migrate", "--config", config], ""),
        (
            &["import", empty.to_str().unwrap(), "--config", config],
            "REST",
        ),
        (&["export", &session, "--config", config], "REST"),
        (&["exec", "--config", config, "hello"], "--data-dir"),
        (&["acp", "--config", config], "--url"),
    ];
    for (args, hint) in cases {
        let (code, stderr) = run_briefly(args).await;
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: {stderr}");
        assert!(
            lines[0].starts_with(&format!("agentd: {held} (")),
            "{args:?}: {stderr}"
        );
        assert!(lines[0].contains(hint), "{args:?}: {stderr}");
    }

    // check-config opens nothing, and takes no lock.
    let (code, stderr) = run_briefly(&["check-config", "--config", config]).await;
    assert_eq!(code, Some(0), "{stderr}");

    // Nothing changed: no turn or task ended, no event added, the holder still named.
    let after = snapshot().await;
    assert_eq!(after, before);
    let events = serde_json::to_string(&after.0).unwrap();
    assert!(!events.contains("server_restarted"), "{events}");
    assert_eq!(
        std::fs::read_to_string(dir.join("data/agentd.lock")).unwrap(),
        format!("{}\n", std::process::id())
    );

    // The live turn goes on and ends once, as its own.
    release.notify_one();
    let end = ws.notification("turn/completed").await;
    assert_eq!(end["reason"], "completed", "{end}");
    let events = app.replay(&session).await;
    let ends: Vec<&Value> = events
        .iter()
        .filter(|e| e["method"] == "turn/completed" || e["method"] == "turn/error")
        .collect();
    assert_eq!(ends.len(), 1, "{events:?}");
    let tasks = app.get_json(&tasks_path, None).await;
    assert_eq!(tasks["tasks"][0]["state"], "running", "{tasks}");
}

#[test]
fn a_lock_left_by_a_killed_server_blocks_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = crate::support::ServerProcess::start(dir.path(), "");
    let pid = server.child.id();
    let lock = dir.path().join("data/agentd.lock");
    assert_eq!(std::fs::read_to_string(&lock).unwrap(), format!("{pid}\n"));
    // SIGKILL: nothing of the server's runs to release anything.
    drop(server);
    assert_eq!(std::fs::read_to_string(&lock).unwrap(), format!("{pid}\n"));
    let data_dir = dir.path().join("data");
    let (code, stderr) = run(
        &["gc", "--data-dir", data_dir.to_str().unwrap()],
        dir.path(),
    );
    assert_eq!(code, Some(0), "{stderr}");
}

/// One ACP exchange with an `agentd acp` child: sends `request`, answers the reply with its id.
async fn acp_ask(
    stdin: &mut tokio::process::ChildStdin,
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    id: u64,
    method: &str,
    params: serde_json::Value,
) -> serde_json::Value {
    use tokio::io::AsyncWriteExt as _;
    let request =
        serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    stdin
        .write_all(format!("{request}\n").as_bytes())
        .await
        .unwrap();
    loop {
        let line = tokio::time::timeout(crate::support::WAIT, lines.next_line())
            .await
            .expect("agentd acp answers in time")
            .unwrap()
            .expect("agentd acp is still there");
        let message: serde_json::Value = serde_json::from_str(&line).unwrap();
        if message["id"] == id {
            return message;
        }
    }
}

#[tokio::test]
async fn in_process_acp_with_users_needs_a_known_user_and_opens_only_their_root() {
    use tokio::io::AsyncBufReadExt as _;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("acp.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ndata_dir = \"{0}/data\"\nworkspace = \"{0}/ws\"\n\
             [[server.users]]\nname = \"alice\"\ntoken = \"alice-token\"\n\
             [[server.users]]\nname = \"bob\"\ntoken = \"bob-token\"\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    for (args, said) in [
        (vec!["acp", "--config", config], "needs --user NAME"),
        (
            vec!["acp", "--config", config, "--user", "carol"],
            "--user \"carol\" is not one of [[server.users]]",
        ),
        (
            vec![
                "acp",
                "--config",
                config,
                "--user",
                "alice",
                "--url",
                "ws://127.0.0.1:1/api/ws",
            ],
            "with --url the token says who you are",
        ),
    ] {
        let (code, stderr) = run_briefly(&args).await;
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(said), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    }
    // Nothing was started for them: the data directory was never made.
    assert!(!dir.path().join("data").exists());

    let workspace = dir.path().join("ws");
    for project in ["alice/proj", "bob/proj"] {
        std::fs::create_dir_all(workspace.join(project)).unwrap();
    }
    let workspace = workspace.canonicalize().unwrap();
    let mut child = tokio::process::Command::from(agentd())
        .args(["acp", "--config", config, "--user", "alice"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let init = acp_ask(
        &mut stdin,
        &mut lines,
        1,
        "initialize",
        serde_json::json!({"protocolVersion": 1, "clientCapabilities": {}}),
    )
    .await;
    assert!(init.get("result").is_some(), "{init}");
    let new_session = |cwd: std::path::PathBuf| serde_json::json!({"cwd": cwd.to_str().unwrap(), "mcpServers": []});
    let mine = acp_ask(
        &mut stdin,
        &mut lines,
        2,
        "session/new",
        new_session(workspace.join("alice/proj")),
    )
    .await;
    let session = mine["result"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("{mine}"))
        .to_string();
    // Another user's folder and the whole workspace are outside alice's root.
    for (id, cwd) in [(3, workspace.join("bob/proj")), (4, workspace.clone())] {
        let refused = acp_ask(&mut stdin, &mut lines, id, "session/new", new_session(cwd)).await;
        let message = refused["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("is outside"), "{refused}");
    }
    drop(stdin);
    let status = tokio::time::timeout(crate::support::WAIT, child.wait())
        .await
        .expect("agentd acp ends when its input closes")
        .unwrap();
    assert!(status.success(), "{status:?}");

    // The session was made as alice's: bob cannot see it, alice can.
    let (code, stderr) =
        run_briefly(&["export", &session, "--config", config, "--user", "bob"]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("unknown session"), "{stderr}");
    let (code, stderr) =
        run_briefly(&["export", &session, "--config", config, "--user", "alice"]).await;
    assert_eq!(code, Some(0), "{stderr}");
}

/// `check-config` refuses a hook matcher that matches no tool, naming the hook and the
/// matcher, takes Claude Code's names and MCP and plugin tools, and warns (without failing)
/// about a hook command that runs a script the agent could rewrite.
#[test]
fn check_config_refuses_a_matcher_of_no_tool_and_warns_of_workspace_scripts() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().canonicalize().unwrap();
    let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
    let hook = |matcher: &str, command: &str| {
        format!(
            "[[hooks]]\nname = \"guard\"\nevent = \"PreToolUse\"\nmatcher = {matcher:?}\n\
             command = {command:?}\n"
        )
    };
    let check = |config: &str| {
        let output = agentd()
            .args(["check-config", "--config", config])
            .current_dir(dir.path())
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };

    write("typo.toml", &hook("Bash|shel", "/etc/agentd/hooks/guard"));
    let (code, stderr) = check("typo.toml");
    assert_eq!(code, Some(2), "{stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("agentd:"))
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("hooks[0]")
            && lines[0].contains("\"guard\"")
            && lines[0].contains("\"shel\""),
        "{stderr}"
    );

    let tools = "[[plugins]]\nname = \"lint\"\ndescription = \"d\"\ncommand = \"/bin/true\"\n\
                 [[mcp_servers]]\nname = \"gh\"\ncommand = \"/bin/true\"\n";
    write(
        "fine.toml",
        &format!(
            "{}{tools}",
            hook(
                "Edit|Write|MultiEdit|lint|mcp__gh__.*|group:fs",
                "/etc/agentd/hooks/guard"
            )
        ),
    );
    let (code, stderr) = check("fine.toml");
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
    write(
        "other_server.toml",
        &format!(
            "{}{tools}",
            hook("mcp__gitlab__.*", "/etc/agentd/hooks/guard")
        ),
    );
    assert_eq!(check("other_server.toml").0, Some(2));

    // A script in the workspace, or relative to the session's cwd: a warning, not a refusal.
    let inside = cwd.join("workspace/hooks/guard.sh");
    for command in [
        "python3 .agents/hooks/check.py",
        "./scripts/guard.sh",
        inside.to_str().unwrap(),
    ] {
        write("inside.toml", &hook("Bash", command));
        let (code, stderr) = check("inside.toml");
        assert_eq!(code, Some(0), "{command}: {stderr}");
        let warnings: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("warning: hooks[0]"))
            .collect();
        assert_eq!(warnings.len(), 1, "{command}: {stderr}");
        assert!(
            warnings[0].contains("outside the workspace"),
            "{command}: {stderr}"
        );
    }
}
