//! A store that cannot write: nothing is acknowledged that was not stored, readiness says so,
//! liveness does not care, and work resumes by itself once the disk has room again.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::suite::agent::with_model;
use crate::suite::cluster::Database;
use crate::support::mock_llm::{MockLlm, Reply, Script};
use crate::support::{TestApp, WAIT, config_in};

/// A tmpfs of `mib` MiB mounted at `dir`, unmounted when dropped; `None` (with the reason
/// printed) where this process may not mount.
struct SmallDisk {
    dir: std::path::PathBuf,
}

impl SmallDisk {
    fn mount(dir: &std::path::Path, mib: u32) -> Option<Self> {
        std::fs::create_dir_all(dir).unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir)
            .status();
        match status {
            Ok(status) if status.success() => Some(Self {
                dir: dir.to_path_buf(),
            }),
            other => {
                eprintln!("skipping: cannot mount a tmpfs here ({other:?})");
                None
            }
        }
    }

    /// Writes a file until the disk is full.
    fn fill(&self) {
        use std::io::Write as _;
        let mut file = std::fs::File::create(self.dir.join("filler")).unwrap();
        let block = vec![0u8; 64 * 1024];
        while file.write_all(&block).is_ok() {}
        let _ = file.sync_all();
    }

    fn make_room(&self) {
        std::fs::remove_file(self.dir.join("filler")).unwrap();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.dir)
            .status();
    }
}

#[tokio::test]
async fn a_full_disk_acknowledges_nothing_it_did_not_store_and_recovers_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let Some(disk) = SmallDisk::mount(&dir.path().join("data"), 32) else {
        return;
    };
    let app = TestApp::start_in(dir, config_in(disk.dir.parent().unwrap())).await;
    std::fs::write(app.workspace().join("note.txt"), "hello ".repeat(1000)).unwrap();
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let read = json!({"path": "note.txt"});
    assert_eq!(
        ws.invoke(&session, "read_file", read.clone()).await["success"],
        true
    );

    disk.fill();
    let mut acknowledged = Vec::new();
    let mut refused = 0;
    // The WAL's pages already on disk take some events; the rest find no room.
    for _ in 0..5000 {
        if refused >= 3 {
            break;
        }
        let (_, answer) = ws
            .call(
                "tool/invoke",
                json!({"session_id": session, "name": "read_file", "arguments": read}),
            )
            .await;
        match answer.get("result") {
            Some(result) => acknowledged.push(result["tool_call_id"].clone()),
            None => {
                assert_eq!(
                    answer["error"]["data"]["kind"], "storage_unavailable",
                    "{answer}"
                );
                refused += 1;
            }
        }
    }
    assert!(refused > 0, "a full disk refused nothing");
    let (ready, body) = app.get("/readyz", None).await;
    assert_eq!(ready, 503, "{body}");
    assert_eq!(app.get("/healthz", None).await.0, 200);

    disk.make_room();
    // The session tries its held events again on its own; readiness comes back with them.
    let deadline = tokio::time::Instant::now() + WAIT;
    while app.get("/readyz", None).await.0 != 200 {
        assert!(tokio::time::Instant::now() < deadline, "never ready again");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let after = ws.invoke(&session, "read_file", read.clone()).await;
    assert_eq!(after["success"], true, "{after}");
    acknowledged.push(after["tool_call_id"].clone());

    // Every call that was answered with a result is in the replay, with its end.
    let mut other = app.ws().await;
    let (events, _) = other
        .call(
            "session/open",
            json!({"session_id": session, "after_seq": 0}),
        )
        .await;
    let completed: Vec<&Value> = events
        .iter()
        .filter(|e| e["method"] == "tool/completed")
        .map(|e| &e["params"]["tool_call_id"])
        .collect();
    for id in &acknowledged {
        assert!(
            completed.contains(&id),
            "{id} was acknowledged but is not stored"
        );
    }
    let seqs: Vec<i64> = events
        .iter()
        .map(|e| e["params"]["seq"].as_i64().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
}

/// Refuses every connection to `name` and ends the ones it has, as a PostgreSQL restart does
/// to its clients; `allow` lets them in again.
async fn postgres_outage(admin: &str, name: &str, allow: bool) {
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(admin).await.expect("postgres");
    sqlx::query(&format!(
        "ALTER DATABASE {name} WITH ALLOW_CONNECTIONS {allow}"
    ))
    .execute(&mut conn)
    .await
    .unwrap();
    if !allow {
        sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
            .bind(name)
            .execute(&mut conn)
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn postgres_lost_mid_turn_ends_it_storage_unavailable_and_work_resumes_by_itself() {
    let Some(db) = Database::create().await else {
        return;
    };
    let release = Arc::new(Notify::new());
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::hold(&["half "], Arc::clone(&release), &["an answer"]),
        Reply::text(&["after the outage"]),
    ]))
    .await;
    let url = db.url.clone();
    let model = with_model(&mock);
    let app = TestApp::spawn_with(move |c| {
        model(c);
        c.server.database_url = Some(agentd::config::Secret::new(url));
    })
    .await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (early, answer) = ws
        .call(
            "turn/start",
            json!({"session_id": session, "input": [{"kind": "text", "text": "go"}]}),
        )
        .await;
    let first = answer["result"]["turn_id"].clone();
    // The model's first words may come before the answer.
    if !early.iter().any(|n| n["method"] == "message/delta") {
        assert_eq!(ws.notification("message/delta").await["text"], "half ");
    }

    // The database goes away while the model is answering; the turn's next write fails.
    postgres_outage(&db.admin, &db.name, false).await;
    release.notify_one();
    let deadline = tokio::time::Instant::now() + WAIT;
    while app.get("/readyz", None).await.0 != 503 {
        assert!(tokio::time::Instant::now() < deadline, "never unready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(app.get("/healthz", None).await.0, 200);

    // Back: the held events are stored by themselves and reach the watcher, the turn's
    // ending included.
    postgres_outage(&db.admin, &db.name, true).await;
    let ended = loop {
        let frame = ws.next_json().await;
        if frame["method"] == "turn/error" || frame["method"] == "turn/completed" {
            break frame;
        }
    };
    assert_eq!(ended["method"], "turn/error", "{ended}");
    assert_eq!(ended["params"]["turn_id"], first);
    assert_eq!(ended["params"]["code"], "storage_unavailable", "{ended}");
    let deadline = tokio::time::Instant::now() + WAIT;
    while app.get("/readyz", None).await.0 != 200 {
        assert!(tokio::time::Instant::now() < deadline, "never ready again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The next turn runs as if nothing happened, and the replay has both turns in order.
    ws.result(
        "turn/start",
        json!({"session_id": session, "input": [{"kind": "text", "text": "again"}]}),
    )
    .await;
    let completed = ws.notification("turn/completed").await;
    assert_eq!(completed["reason"], "completed", "{completed}");
    let mut other = app.ws().await;
    let (events, _) = other
        .call(
            "session/open",
            json!({"session_id": session, "after_seq": 0}),
        )
        .await;
    let ends: Vec<&Value> = events
        .iter()
        .filter(|e| e["method"] == "turn/error" || e["method"] == "turn/completed")
        .map(|e| &e["method"])
        .collect();
    assert_eq!(ends, ["turn/error", "turn/completed"], "{events:?}");
    let seqs: Vec<i64> = events
        .iter()
        .map(|e| e["params"]["seq"].as_i64().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    // The first turn's model call was billed while the database was away: its row was kept
    // and written with the next one.
    let cost = app
        .get_json(&format!("/api/sessions/{session}/cost"), None)
        .await;
    assert_eq!(cost["rows"].as_array().unwrap().len(), 2, "{cost}");
    drop(other);
    drop(ws);
    app.stop().await;
    db.drop_now().await;
}
