//! Hostile tests of the sandbox: two users on one server, each trying to reach the other's
//! files, the server's secrets, its network and its process table, and to outlive their
//! sessions. A test whose layer the kernel lacks prints why and returns; the CI machine has
//! them all (Landlock ABI 7, user namespaces, a writable pids cgroup).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{ServerProcess, TestApp, WAIT, WsClient, alice_and_bob};

/// The layers `/readyz` says are enforced.
async fn layers(app: &TestApp) -> Vec<String> {
    let ready = app.get_json("/readyz", None).await;
    ready["sandbox"]["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .collect()
}

/// Whether every layer in `needed` is enforced; prints what is missing otherwise.
async fn has_layers(app: &TestApp, test: &str, needed: &[&str]) -> bool {
    let layers = layers(app).await;
    let missing: Vec<&&str> = needed
        .iter()
        .filter(|n| !layers.iter().any(|l| l == **n))
        .collect();
    if missing.is_empty() {
        return true;
    }
    eprintln!("skipping {test}: this kernel lacks the sandbox layers {missing:?}");
    false
}

async fn shell(ws: &mut WsClient, session: &str, command: &str) -> String {
    let result = ws
        .invoke(session, "shell", json!({"command": command}))
        .await;
    result["output"].as_str().unwrap().to_string()
}

/// How many live `sleep` processes have `marker` in their arguments (the launcher in front
/// of a command carries the whole command line too, and is not counted).
fn processes_with(marker: &str) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| {
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            // A zombie has given up everything but its table entry.
            let state = stat.rsplit(") ").next().and_then(|s| s.chars().next());
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            let mut argv = cmdline.split('\0');
            state != Some('Z') && argv.next() == Some("sleep") && argv.any(|a| a.contains(marker))
        })
        .count()
}

/// Polls the process table until `count(marker)` satisfies `done`, failing after [`WAIT`].
/// Nothing signals a process's death to an unrelated observer, so this is a bounded poll.
async fn until_processes(marker: &str, what: &str, done: impl Fn(usize) -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let count = processes_with(marker);
        if done(count) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: {count} processes with {marker:?} remain"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_users_commands_reach_only_her_own_files() {
    let dir = tempfile::tempdir().unwrap();
    let config_file = dir.path().join("agentd.toml");
    std::fs::write(&config_file, "# users: alice-token bob-token\n").unwrap();
    let mut config = crate::support::config_in(dir.path());
    alice_and_bob(&mut config);
    config.file = Some(config_file.clone());
    let app = TestApp::start_in(dir, config).await;
    if !has_layers(
        &app,
        "a_users_commands_reach_only_her_own_files",
        &["landlock"],
    )
    .await
    {
        return;
    }
    let bob_dir = app.workspace().join("bob/proj");
    std::fs::create_dir_all(&bob_dir).unwrap();
    std::fs::write(bob_dir.join("secret.txt"), "bob-secret").unwrap();
    let alice_root = app.workspace().join("alice");
    std::fs::create_dir_all(&alice_root).unwrap();
    std::fs::write(alice_root.join("own.txt"), "alice-own").unwrap();
    let data = app.dir.path().join("data");

    let mut alice = app.ws_with(Some("alice-token"), None).await.unwrap();
    let session = alice.open().await;
    // The control: her own file reads, so a refusal below is the sandbox's doing.
    assert!(
        shell(&mut alice, &session, "cat own.txt")
            .await
            .contains("alice-own")
    );

    let secret = bob_dir.join("secret.txt");
    for attempt in [
        "cat ../bob/proj/secret.txt".to_string(),
        format!("cat {}", secret.display()),
        format!("cd /; cat {}", secret.display()),
        format!("cat {}", config_file.display()),
        format!("grep -r token {}", app.dir.path().display()),
        format!("head -c 64 {}/agentd.db | od -c | head -3", data.display()),
        format!("cat /proc/{}/environ | tr '\\0' '\\n'", std::process::id()),
        format!("ls /proc/{}/fd", std::process::id()),
    ] {
        let output = shell(&mut alice, &session, &attempt).await;
        for leaked in [
            "bob-secret",
            "alice-token",
            "bob-token",
            "S   Q   L",
            "PATH=",
        ] {
            assert!(
                !output.contains(leaked),
                "`{attempt}` leaked {leaked:?}:\n{output}"
            );
        }
    }

    let listed = shell(&mut alice, &session, &format!("ls -a {}", data.display())).await;
    assert!(
        !listed.contains("agentd.db"),
        "the data dir is listed:\n{listed}"
    );

    for target in [
        bob_dir.join("pwned"),
        app.workspace().join("pwned"),
        data.join("pwned"),
        app.dir.path().join("pwned"),
    ] {
        shell(
            &mut alice,
            &session,
            &format!("echo x > {}", target.display()),
        )
        .await;
        assert!(!target.exists(), "alice wrote {}", target.display());
    }
    shell(&mut alice, &session, "echo mine > made.txt").await;
    assert_eq!(
        std::fs::read_to_string(alice_root.join("made.txt")).unwrap(),
        "mine\n"
    );
}

#[tokio::test]
async fn a_commands_tmp_is_its_sessions_own() {
    let app = TestApp::spawn().await;
    if !has_layers(&app, "a_commands_tmp_is_its_sessions_own", &["mount_ns"]).await {
        return;
    }
    let marker = format!("host-only-{}", std::process::id());
    let host_file = PathBuf::from("/tmp").join(&marker);
    std::fs::write(&host_file, "host").unwrap();
    let mut ws = app.ws().await;
    let one = ws.open().await;
    let two = ws.open().await;
    let listed = shell(&mut ws, &one, "ls -a /tmp; echo kept > /tmp/note").await;
    std::fs::remove_file(&host_file).unwrap();
    assert!(
        !listed.contains(&marker),
        "the host's /tmp shows:\n{listed}"
    );
    assert!(shell(&mut ws, &one, "cat /tmp/note").await.contains("kept"));
    assert!(!shell(&mut ws, &two, "cat /tmp/note").await.contains("kept"));
}

#[tokio::test]
async fn without_network_no_socket_reaches_the_server_or_the_database() {
    let app = TestApp::spawn().await;
    if !has_layers(&app, "without_network_no_socket_reaches_…", &["seccomp"]).await {
        return;
    }
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let port = app.addr.port();
    for target in [format!("127.0.0.1/{port}"), "127.0.0.1/5432".to_string()] {
        let output = shell(
            &mut ws,
            &session,
            &format!("bash -c 'exec 3<>/dev/tcp/{target} && echo CONNECTED'"),
        )
        .await;
        assert!(!output.contains("CONNECTED"), "{target}: {output}");
    }
    let output = shell(&mut ws, &session, "ls /run/postgresql /var/run/postgresql").await;
    assert!(!output.contains(".s.PGSQL"), "{output}");
    // Nor does a Unix socket by its path, which Landlock does not guard: the database's.
    let unix_socket = std::path::Path::new("/var/run/postgresql/.s.PGSQL.5432");
    let psql = "psql -h /var/run/postgresql -U postgres -d postgres -tAc 'select 4200+42'";
    let has_psql = std::path::Path::new("/usr/bin/psql").exists() && unix_socket.exists();
    if has_psql {
        let output = shell(&mut ws, &session, psql).await;
        assert!(!output.contains("4242"), "{output}");
    } else {
        eprintln!("no psql or PostgreSQL socket here: the Unix-socket case is not tried");
    }

    // The control: with network on, the same command reaches the server.
    let open = TestApp::spawn_with(|c| c.sandbox.network = true).await;
    let mut ws = open.ws().await;
    let session = ws.open().await;
    let port = open.addr.port();
    let output = shell(
        &mut ws,
        &session,
        &format!("bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED'"),
    )
    .await;
    assert!(output.contains("CONNECTED"), "{output}");
    assert_eq!(
        open.get_json("/readyz", None).await["sandbox"]["network"],
        true
    );
    if has_psql {
        // The control for the Unix socket: with network on, the same query is answered.
        let output = shell(&mut ws, &session, psql).await;
        assert!(output.contains("4242"), "{output}");
    }
}

#[tokio::test]
async fn processes_die_with_their_session_even_after_setsid() {
    let app = TestApp::spawn().await;
    if !has_layers(&app, "processes_die_with_their_session…", &["pid_ns"]).await {
        return;
    }
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let marker = "987601";
    let result = ws
        .invoke(
            &session,
            "exec_command",
            json!({"cmd": format!("setsid sleep {marker}1 & (setsid sleep {marker}2 &); exec sleep {marker}3"), "yield_time_ms": 250}),
        )
        .await;
    assert_eq!(result["success"], true, "{result}");
    until_processes(marker, "started", |n| n == 3).await;

    // A `shell` command's stragglers end with the command, setsid or not.
    shell(&mut ws, &session, "setsid sleep 9876051 & echo left").await;
    until_processes("9876051", "shell's straggler", |n| n == 0).await;

    assert_eq!(app.delete_session(&session).await, 204);
    until_processes(marker, "after deleting the session", |n| n == 0).await;
}

#[tokio::test]
async fn a_killed_server_leaves_no_command_behind() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), "");
    let pid_ns = server
        .startup_log
        .iter()
        .any(|line| line.contains("sandbox enforced") && line.contains("pid_ns"));
    if !pid_ns {
        eprintln!("skipping a_killed_server_leaves_no_command_behind: no PID namespace here");
        return;
    }
    let mut ws = server.ws().await;
    let session = ws.open().await;
    let marker = "987611";
    ws.invoke(
        &session,
        "exec_command",
        json!({"cmd": format!("setsid sleep {marker}1 & exec sleep {marker}2"), "yield_time_ms": 250}),
    )
    .await;
    until_processes(marker, "started", |n| n == 2).await;
    let mut server = server;
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    until_processes(marker, "after kill -9 of the server", |n| n == 0).await;
}

#[tokio::test]
async fn a_fork_bomb_stops_at_max_processes_and_the_rest_goes_on() {
    let app = TestApp::spawn_with(|c| c.sandbox.max_processes = 256).await;
    if !has_layers(
        &app,
        "a_fork_bomb_stops_at_max_processes…",
        &["pids_cgroup"],
    )
    .await
    {
        return;
    }
    let mut ws = app.ws().await;
    let bomb = ws.open().await;
    let other = ws.open().await;
    let result = ws
        .invoke(
            &bomb,
            "exec_command",
            json!({
                "cmd": "(i=0; while [ $i -lt 300 ]; do sleep 987621 & i=$((i+1)); done) 2>/dev/null; echo spawned; exec sleep 987622",
                "yield_time_ms": 5000,
            }),
        )
        .await;
    let output = result["output"].as_str().unwrap().to_string();
    assert!(output.contains("spawned"), "{output}");
    let held = processes_with("987621");
    assert!(
        (200..=256).contains(&held),
        "the session holds {held} sleeps; max_processes is 256"
    );
    // The bomb holds its whole allowance; another session and the server are unaffected.
    assert!(
        shell(&mut ws, &other, "echo still-working")
            .await
            .contains("still-working")
    );
    assert_eq!(app.get("/healthz", None).await.0, 200);
    assert_eq!(app.delete_session(&bomb).await, 204);
    until_processes("98762", "after deleting the bomb's session", |n| n == 0).await;
}

#[tokio::test]
async fn a_command_over_the_memory_cap_is_killed_and_the_rest_goes_on() {
    let app = TestApp::spawn_with(|c| c.sandbox.memory_max_mb = 256).await;
    if !has_layers(&app, "a_command_over_the_memory_cap…", &["memory_cgroup"]).await {
        return;
    }
    let mut ws = app.ws().await;
    let hungry = ws.open().await;
    let other = ws.open().await;
    // dd reads 1 GiB into one buffer, touching every page of it.
    let hog = "dd if=/dev/zero of=/dev/null bs=1G count=1";
    let result = ws.invoke(&hungry, "shell", json!({"command": hog})).await;
    let output = result["output"].as_str().unwrap();
    assert_eq!(result["success"], false, "{result}");
    assert!(
        output.starts_with("killed: out of memory (limit 256 MiB)\nexit code: 137"),
        "{output}"
    );
    assert_eq!(result["structured_metadata"]["out_of_memory"], true);
    // A command that outlives the process the cap killed still hears of it.
    let result = ws
        .invoke(
            &hungry,
            "shell",
            json!({"command": format!("{hog}; echo after=$?")}),
        )
        .await;
    let output = result["output"].as_str().unwrap();
    assert!(output.contains("after=137"), "{output}");
    assert!(
        output.ends_with("killed: out of memory (limit 256 MiB): a process this command started"),
        "{output}"
    );
    // A session's first command, with no kill, says nothing of memory.
    let first = shell(&mut ws, &other, "echo first").await;
    assert!(!first.contains("out of memory"), "{first}");
    // Under the cap the same session, the other one and the server carry on.
    assert!(
        shell(
            &mut ws,
            &hungry,
            "dd if=/dev/zero of=/dev/null bs=64M count=1 2>&1; echo ok"
        )
        .await
        .contains("ok")
    );
    assert!(
        shell(&mut ws, &other, "echo still-working")
            .await
            .contains("still-working")
    );
    assert_eq!(app.get("/healthz", None).await.0, 200);
}

#[tokio::test]
async fn busy_loops_get_no_more_cpu_than_the_session_cap() {
    let app = TestApp::spawn_with(|c| c.sandbox.cpu_max_percent = 20).await;
    if !has_layers(&app, "busy_loops_get_no_more_cpu…", &["cpu_cgroup"]).await {
        return;
    }
    let mut ws = app.ws().await;
    let busy = ws.open().await;
    let other = ws.open().await;
    // Each loop writes the CPU time it got per second of wall time to a file of its own (two
    // writers on one terminal may interleave); two of them share the session's 20% of one core.
    let spin = "import time\nw = time.monotonic(); c = time.process_time()\nwhile time.monotonic() - w < 1.5: pass\nprint('share', (time.process_time() - c) / (time.monotonic() - w))";
    let command = format!(
        "printf \"{spin}\" > /tmp/spin.py; python3 /tmp/spin.py > /tmp/a.out & python3 /tmp/spin.py > /tmp/b.out; wait; cat /tmp/a.out /tmp/b.out"
    );
    let output = shell(&mut ws, &busy, &command).await;
    let shares: Vec<f64> = output
        .lines()
        .filter_map(|l| l.strip_prefix("share "))
        .map(|v| v.trim().parse().unwrap())
        .collect();
    assert_eq!(shares.len(), 2, "{output}");
    let total: f64 = shares.iter().sum();
    // Uncapped, two loops on a two-core machine get close to 2.0.
    assert!(
        total < 0.5,
        "two loops got {total:.2} cores under a 20% cap: {output}"
    );
    assert!(
        shell(&mut ws, &other, "echo still-working")
            .await
            .contains("still-working")
    );
}

#[tokio::test]
async fn read_only_mode_leaves_the_workspace_unchanged() {
    let app = TestApp::spawn_with(|c| c.sandbox.mode = agentd::config::SandboxMode::ReadOnly).await;
    std::fs::write(app.workspace().join("seen.txt"), "visible").unwrap();
    let mut ws = app.ws().await;
    let session = ws.open().await;
    assert!(
        shell(&mut ws, &session, "cat seen.txt")
            .await
            .contains("visible")
    );
    shell(&mut ws, &session, "echo x > made.txt; rm -f seen.txt").await;
    assert!(!app.workspace().join("made.txt").exists());
    assert!(app.workspace().join("seen.txt").exists());
    assert_eq!(
        app.get_json("/readyz", None).await["sandbox"]["mode"],
        "read-only"
    );
}

#[tokio::test]
async fn session_open_and_readyz_say_how_commands_are_confined() {
    let app = TestApp::spawn().await;
    let mut ws = app.ws().await;
    let opened = ws.result("session/open", json!({})).await;
    let sandbox = &opened["sandbox"];
    assert_eq!(sandbox["mode"], "workspace-write");
    assert_eq!(sandbox["network"], false);
    let layers: Vec<&str> = sandbox["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert!(layers.contains(&"landlock"), "{layers:?}");
    assert_eq!(app.get_json("/readyz", None).await["sandbox"], *sandbox);

    let off = TestApp::spawn_with(|c| c.sandbox.mode = agentd::config::SandboxMode::Off).await;
    let mut ws = off.ws().await;
    let opened = ws.result("session/open", json!({})).await;
    assert_eq!(
        opened["sandbox"],
        json!({"mode": "off", "network": true, "layers": []})
    );
    // Unconfined, a command reads outside the workspace again: the control for the tests above.
    let session = opened["session_id"].as_str().unwrap();
    let outside = off.dir.path().join("outside.txt");
    std::fs::write(&outside, "reachable").unwrap();
    let output = shell(&mut ws, session, &format!("cat {}", outside.display())).await;
    assert!(output.contains("reachable"), "{output}");
}

#[tokio::test]
async fn a_terminal_command_runs_confined_and_ctrl_c_reaches_it() {
    let app = TestApp::spawn().await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let started = ws
        .invoke(
            &session,
            "exec_command",
            json!({"cmd": "tty; trap 'echo caught-int; exit 7' INT; echo ready; while :; do sleep 0.05; done", "tty": true, "yield_time_ms": 1000}),
        )
        .await;
    let output = started["output"].as_str().unwrap();
    assert!(output.contains("/dev/pts/"), "{output}");
    assert!(output.contains("ready"), "{output}");
    let id = started["structured_metadata"]["session_id"].clone();
    let mut seen = String::new();
    let mut exit = Value::Null;
    // The first write may land before the trap is read; Ctrl-C again until the shell says so.
    for _ in 0..20 {
        let answer = ws
            .invoke(
                &session,
                "write_stdin",
                json!({"session_id": id, "chars": "\u{3}", "yield_time_ms": 500}),
            )
            .await;
        seen.push_str(answer["output"].as_str().unwrap_or_default());
        exit = answer["structured_metadata"]["exit_code"].clone();
        if !exit.is_null() {
            break;
        }
    }
    assert!(seen.contains("caught-int"), "{seen}");
    assert_eq!(exit, 7, "{seen}");
}

#[tokio::test]
async fn a_terminal_is_its_sessions_alone() {
    let app = TestApp::spawn_with(alice_and_bob).await;
    if !has_layers(
        &app,
        "a_terminal_is_its_sessions_alone",
        &["landlock", "private_pts"],
    )
    .await
    {
        return;
    }
    let mut bob = app.ws_with(Some("bob-token"), None).await.unwrap();
    let bobs = bob.open().await;
    let started = bob
        .invoke(
            &bobs,
            "exec_command",
            json!({"cmd": "tty; cat", "tty": true, "yield_time_ms": 1000}),
        )
        .await;
    let answer: Value = serde_json::from_str(started["output"].as_str().unwrap()).unwrap();
    let output = answer["output"].as_str().unwrap();
    // His own terminal is there under its name.
    let terminal = output
        .lines()
        .map(str::trim)
        .find(|line| line.starts_with("/dev/pts/"))
        .unwrap_or_else(|| panic!("tty names the terminal: {output}"))
        .to_string();
    let process = started["structured_metadata"]["session_id"].clone();

    let mut alice = app.ws_with(Some("alice-token"), None).await.unwrap();
    let alices = alice.open().await;
    let bobs_other = bob.open().await;
    for (ws, session, who) in [
        (&mut alice, &alices, "alice"),
        (&mut bob, &bobs_other, "bob's other session"),
    ] {
        // Only the session's own devpts instance: its ptmx and nothing else.
        let listed = shell(ws, session, "ls /dev/pts").await;
        assert!(
            listed
                .lines()
                .skip_while(|l| !l.starts_with("output"))
                .skip(1)
                .all(|l| l.trim() == "ptmx"),
            "{who} sees other terminals: {listed}"
        );
        let written = shell(
            ws,
            session,
            &format!("echo intruder > {terminal}; echo rc=$?"),
        )
        .await;
        assert!(
            !written.contains("rc=0"),
            "{who} wrote to {terminal}: {written}"
        );
        let settings = shell(
            ws,
            session,
            &format!("stty -F {terminal} -echo; echo rc=$?"),
        )
        .await;
        assert!(
            !settings.contains("rc=0"),
            "{who} changed {terminal}: {settings}"
        );
        // A terminal it opens itself works, and is its own.
        let opened = shell(ws, session, "script -qc 'tty' /dev/null; echo rc=$?").await;
        assert!(opened.contains("rc=0"), "{who}: {opened}");
    }
    // Bob's terminal still gets what he types, and nothing of theirs.
    let typed = bob
        .invoke(
            &bobs,
            "write_stdin",
            json!({"session_id": process, "chars": "mine\n", "yield_time_ms": 500}),
        )
        .await;
    let echoed = typed["output"].as_str().unwrap();
    let echoed: Value = serde_json::from_str(echoed).unwrap();
    let echoed = echoed["output"].as_str().unwrap();
    assert!(echoed.contains("mine"), "{echoed}");
    assert!(!echoed.contains("intruder"), "{echoed}");
}

#[tokio::test]
async fn a_repositorys_config_cannot_make_git_run_a_command() {
    let app = TestApp::spawn().await;
    if !has_layers(
        &app,
        "a_repositorys_config_cannot_make_git_run_a_command",
        &["landlock", "mount_ns"],
    )
    .await
    {
        return;
    }
    let repo = app.workspace().join("proj");
    std::fs::create_dir_all(&repo).unwrap();
    let git = |args: &[&str]| {
        let status = std::process::Command::new("git")
            .args(args)
            .current_dir(&repo)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .status()
            .unwrap();
        assert!(status.success(), "git {args:?}");
    };
    git(&["init", "-q"]);
    // What a cloned or tampered repository can carry: an fsmonitor command and a hook.
    let config = repo.join(".git/config");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("[core]\n\tfsmonitor = \"touch fsmonitor-ran\"\n");
    std::fs::write(&config, text).unwrap();
    let hook = repo.join(".git/hooks/pre-commit");
    std::fs::write(&hook, "#!/bin/sh\ntouch hook-ran\n").unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

    let mut ws = app.ws().await;
    let session = ws.open().await;
    let run = |command: &str| json!({"command": command, "workdir": "proj"});
    let status = ws
        .invoke(&session, "shell", run("git status --short; echo rc=$?"))
        .await;
    assert!(
        status["output"].as_str().unwrap().contains("rc=0"),
        "{status}"
    );
    let commit = ws
        .invoke(
            &session,
            "shell",
            run("git -c user.name=a -c user.email=a@b commit -q --allow-empty -m x; echo rc=$?"),
        )
        .await;
    assert!(
        commit["output"].as_str().unwrap().contains("rc=0"),
        "{commit}"
    );
    assert!(
        !repo.join("fsmonitor-ran").exists(),
        "git ran the repository's fsmonitor"
    );
    assert!(
        !repo.join("hook-ran").exists(),
        "git ran the repository's hook"
    );

    // Nor can a command plant them for a later git command (an allowed one, say).
    for attempt in [
        "git config core.fsmonitor 'touch planted'",
        "echo '[alias] x = !touch planted' >> .git/config",
        "rm -f .git/config",
        "mv .git/config .git/config.old",
        "printf '#!/bin/sh\\ntouch planted\\n' > .git/hooks/post-commit",
    ] {
        let out = ws
            .invoke(&session, "shell", run(&format!("{attempt}; echo rc=$?")))
            .await;
        assert!(
            !out["output"].as_str().unwrap().contains("rc=0"),
            "{attempt}: {out}"
        );
    }
    assert!(
        std::fs::read_to_string(&config)
            .unwrap()
            .contains("fsmonitor-ran")
    );
    assert!(!repo.join(".git/hooks/post-commit").exists());
}

#[tokio::test]
async fn a_sessions_tmp_is_capped_and_off_the_data_disk() {
    let app = TestApp::spawn_with(|c| {
        alice_and_bob(c);
        c.sandbox.tmp_max_mb = 8;
    })
    .await;
    if !has_layers(
        &app,
        "a_sessions_tmp_is_capped_and_off_the_data_disk",
        &["tmp_quota"],
    )
    .await
    {
        return;
    }
    let mut alice = app.ws_with(Some("alice-token"), None).await.unwrap();
    let alices = alice.open().await;
    let filled = shell(
        &mut alice,
        &alices,
        "head -c 20000000 /dev/zero > /tmp/big; echo rc=$?; du -k /tmp/big",
    )
    .await;
    assert!(
        !filled.contains("rc=0"),
        "20 MB fit in an 8 MiB /tmp: {filled}"
    );
    // What it did write is not on the data dir's disk.
    let data = app.dir.path().join("data");
    let session_tmp = data.join("sandbox").join(&alices).join("tmp");
    use std::os::unix::fs::MetadataExt as _;
    assert_ne!(
        std::fs::metadata(&session_tmp).unwrap().dev(),
        std::fs::metadata(&data).unwrap().dev(),
        "the session's /tmp is on the data disk"
    );
    // Another user's /tmp is untouched by it and has its own room.
    let mut bob = app.ws_with(Some("bob-token"), None).await.unwrap();
    let bobs = bob.open().await;
    let written = shell(
        &mut bob,
        &bobs,
        "head -c 4000000 /dev/zero > /tmp/mine; echo rc=$?; ls /tmp",
    )
    .await;
    assert!(written.contains("rc=0"), "{written}");
    assert!(!written.contains("big"), "{written}");
}

#[tokio::test]
async fn a_program_behind_a_hidden_path_entry_says_which_entry_and_how_to_grant_it() {
    let dir = tempfile::tempdir().unwrap();
    let hidden = dir.path().join("hidden-bin");
    std::fs::create_dir_all(&hidden).unwrap();
    let tool = hidden.join("mytool");
    std::fs::write(&tool, "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let config = dir.path().join("agentd.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nbind = \"127.0.0.1:0\"\ndata_dir = \"{}\"\nworkspace = \"{}\"\n",
            dir.path().join("data").display(),
            dir.path().join("workspace").display()
        ),
    )
    .unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"));
    command
        .arg("--config")
        .arg(&config)
        .env("PATH", format!("{}:/usr/bin:/bin", hidden.display()))
        .env_remove("AGENTD_BIND");
    let server = tokio::task::spawn_blocking(move || ServerProcess::spawn(command))
        .await
        .unwrap();
    let mut ws = server.ws().await;
    let session = ws.open().await;
    let ran = ws
        .invoke(&session, "shell", json!({"command": "mytool"}))
        .await;
    let output = ran["output"].as_str().unwrap();
    if !output.contains("exit code: 126") && !output.contains("exit code: 127") {
        eprintln!("skipping: the sandbox let the hidden PATH entry through ({output})");
        return;
    }
    assert!(output.contains(&hidden.display().to_string()), "{output}");
    assert!(output.contains("[sandbox] extra_read"), "{output}");
}
