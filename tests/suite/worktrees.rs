//! A session in a git worktree of its own (`session/open {isolation: "worktree"}`): apart
//! from the checkout while it works, merged back or discarded, and never running what the
//! repository's hooks or config would have git run.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use serde_json::{Value, json};

use crate::support::TestApp;

/// Runs git in `dir` with a fixed identity and none of the repository's hooks or fsmonitor
/// (the test's own commands must not leave the marker), failing the test on an error;
/// answers stdout.
fn git(dir: &Path, args: &[&str]) -> String {
    let output = std::process::Command::new("git")
        .args(["-c", "user.name=Test", "-c", "user.email=test@example.com"])
        .args([
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "core.fsmonitor=false",
        ])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .expect("git runs");
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Makes `root` a repository with one commit of `a.txt` and `src/keep.txt`, and arms it the
/// way a hostile agent could: a `post-checkout` hook and an fsmonitor that would each leave
/// `marker` if git ran them.
fn hostile_repository(root: &Path, marker: &Path) {
    std::fs::create_dir_all(root.join("src")).unwrap();
    git(root, &["init", "-q", "-b", "main"]);
    std::fs::write(root.join("a.txt"), "one\n").unwrap();
    std::fs::write(root.join("src/keep.txt"), "keep\n").unwrap();
    git(root, &["add", "-A"]);
    git(root, &["commit", "-q", "-m", "first"]);
    let script = format!("#!/bin/sh\necho ran >> {}\n", marker.display());
    for hook in [
        "post-checkout",
        "pre-merge-commit",
        "post-merge",
        "pre-commit",
    ] {
        let path = root.join(".git/hooks").join(hook);
        std::fs::write(&path, &script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let monitor = root.join(".git/monitor.sh");
    std::fs::write(&monitor, &script).unwrap();
    std::fs::set_permissions(&monitor, std::fs::Permissions::from_mode(0o755)).unwrap();
    git(
        root,
        &["config", "core.fsmonitor", &monitor.to_string_lossy()],
    );
}

/// `git status --porcelain` in `dir`.
fn status(dir: &Path) -> String {
    git(dir, &["status", "--porcelain"])
}

async fn post(app: &TestApp, path: &str, body: Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(app.url(path))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_worktree_session_works_apart_and_merges_back() {
    let app = TestApp::spawn().await;
    let root = app.workspace();
    // Where the sandbox lets commands write, so only git's settings keep a hook from it.
    let marker = app.workspace().join("hook-ran");
    hostile_repository(&root, &marker);
    let mut ws = app.ws().await;
    let opened = ws
        .result(
            "session/open",
            json!({"cwd": "src", "isolation": "worktree"}),
        )
        .await;
    let session = opened["session_id"].as_str().unwrap().to_string();
    let tree = format!(".agentd-worktrees/{session}");
    assert_eq!(
        opened["worktree"],
        json!({"repo": "", "path": tree, "branch": format!("agentd/{session}"),
               "base": "HEAD", "origin_cwd": "src"}),
        "{opened}"
    );
    // The worktree under the repository's own checkout is invisible to it.
    assert_eq!(status(&root), "");

    // The session works in the worktree's `src`: the checkout sees none of it.
    let written = ws
        .invoke(
            &session,
            "shell",
            json!({"command": "echo two >> ../a.txt && echo new > made.txt && cat keep.txt"}),
        )
        .await;
    assert_eq!(written["success"], true, "{written}");
    assert!(
        written["output"].as_str().unwrap().contains("keep"),
        "{written}"
    );
    assert_eq!(
        std::fs::read_to_string(root.join(&tree).join("a.txt")).unwrap(),
        "one\ntwo\n"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("a.txt")).unwrap(),
        "one\n"
    );
    assert!(!root.join("src/made.txt").exists());
    assert_eq!(status(&root), "");

    let merged = ws
        .result(
            "session/merge",
            json!({"session_id": session, "message": "Agent work"}),
        )
        .await;
    assert_eq!(merged["merged"], true, "{merged}");
    assert_eq!(merged["cwd"], "src");
    assert_eq!(
        std::fs::read_to_string(root.join("a.txt")).unwrap(),
        "one\ntwo\n"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("src/made.txt")).unwrap(),
        "new\n"
    );
    assert_eq!(
        git(&root, &["log", "--topo-order", "--format=%s", "-3"]),
        format!("Merge agentd/{session}\nAgent work\nfirst\n")
    );
    assert_eq!(
        git(&root, &["rev-parse", "HEAD"]).trim(),
        merged["commit"].as_str().unwrap()
    );
    assert_eq!(git(&root, &["branch", "--list", "agentd/*"]), "");
    assert!(!root.join(&tree).exists());
    assert_eq!(status(&root), "");

    // The session goes on in the cwd it asked for, on the same connection.
    let read = ws
        .invoke(&session, "read_file", json!({"path": "made.txt"}))
        .await;
    assert!(read["output"].as_str().unwrap().contains("new"), "{read}");
    let (_, again) = ws
        .call("session/merge", json!({"session_id": session}))
        .await;
    assert_eq!(again["error"]["data"]["kind"], "no_worktree", "{again}");

    assert!(
        !marker.exists(),
        "a repository hook or fsmonitor ran: {}",
        std::fs::read_to_string(&marker).unwrap_or_default()
    );
}

#[tokio::test]
async fn a_conflict_keeps_the_worktree_and_discard_or_delete_throw_it_away() {
    let app = TestApp::spawn().await;
    let root = app.workspace().join("proj");
    // Where the sandbox lets commands write, so only git's settings keep a hook from it.
    let marker = app.workspace().join("hook-ran");
    hostile_repository(&root, &marker);
    std::fs::create_dir_all(app.workspace().join("plain")).unwrap();

    // Only a directory in a repository can have a worktree; a base must be a name.
    let (code, refused) = post(
        &app,
        "/api/sessions",
        json!({"cwd": "plain", "isolation": "worktree"}),
    )
    .await;
    assert_eq!(code, 400, "{refused}");
    assert_eq!(refused["error"]["kind"], "invalid_params");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not inside a git repository"),
        "{refused}"
    );
    for base in ["no-such-branch", "--orphan"] {
        let (code, refused) = post(
            &app,
            "/api/sessions",
            json!({"cwd": "proj", "isolation": "worktree", "base": base}),
        )
        .await;
        assert_eq!(code, 400, "{base}: {refused}");
    }
    let listed = app.get_json("/api/sessions", None).await;
    assert_eq!(
        listed["sessions"].as_array().map(Vec::len),
        Some(0),
        "a refused worktree leaves no session: {listed}"
    );

    let (code, created) = post(
        &app,
        "/api/sessions",
        json!({"cwd": "proj", "isolation": "worktree", "base": "main"}),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    let session = created["session_id"].as_str().unwrap().to_string();
    let tree = app
        .workspace()
        .join(created["worktree"]["path"].as_str().unwrap());
    assert_eq!(created["cwd"], created["worktree"]["path"]);
    let mut ws = app.ws().await;
    ws.result("session/open", json!({"session_id": session}))
        .await;
    let changed = ws
        .invoke(&session, "shell", json!({"command": "echo theirs > a.txt"}))
        .await;
    assert_eq!(changed["success"], true, "{changed}");
    std::fs::write(root.join("a.txt"), "ours\n").unwrap();
    git(&root, &["commit", "-q", "-am", "ours"]);

    let (code, conflict) = post(&app, &format!("/api/sessions/{session}/merge"), json!({})).await;
    assert_eq!(code, 409, "{conflict}");
    assert_eq!(conflict["error"]["kind"], "merge_conflict");
    assert!(
        conflict["error"]["message"]
            .as_str()
            .unwrap()
            .contains("a.txt"),
        "{conflict}"
    );
    // Nothing changed: the checkout is clean and as it was, the worktree kept.
    assert_eq!(
        std::fs::read_to_string(root.join("a.txt")).unwrap(),
        "ours\n"
    );
    assert_eq!(status(&root), "");
    assert!(tree.join("a.txt").exists());

    let (code, discarded) =
        post(&app, &format!("/api/sessions/{session}/discard"), json!({})).await;
    assert_eq!(code, 200, "{discarded}");
    assert_eq!(discarded["discarded"], true);
    assert!(!tree.exists());
    assert_eq!(git(&root, &["branch", "--list", "agentd/*"]), "");
    assert_eq!(
        std::fs::read_to_string(root.join("a.txt")).unwrap(),
        "ours\n"
    );
    let row = app
        .get_json(&format!("/api/sessions/{session}"), None)
        .await;
    assert_eq!(row["cwd"], "proj", "{row}");
    assert!(row.get("worktree").is_none(), "{row}");

    // Deleting a session deletes its worktree and branch.
    let (_, created) = post(
        &app,
        "/api/sessions",
        json!({"cwd": "proj", "isolation": "worktree"}),
    )
    .await;
    let doomed = created["session_id"].as_str().unwrap().to_string();
    let tree = app
        .workspace()
        .join(created["worktree"]["path"].as_str().unwrap());
    assert!(tree.join("a.txt").exists());
    assert_eq!(app.delete_session(&doomed).await, 204);
    assert!(!tree.exists());
    assert_eq!(git(&root, &["branch", "--list", "agentd/*"]), "");
    assert!(!marker.exists(), "a repository hook or fsmonitor ran");
}

#[tokio::test]
async fn a_sub_agent_in_its_own_worktree_leaves_its_work_on_a_branch() {
    use crate::support::mock_llm::{MockLlm, Reply, Script, ScriptedCall};
    // The child writes one file, then answers; every request of it comes here.
    let mock = MockLlm::start(Script::route(|request: &Value| {
        let messages = request["messages"].as_array().unwrap();
        let asked = messages.iter().find(|m| m["role"] == "user").unwrap();
        if messages.last().unwrap()["role"] == "tool" || asked["content"] == "look only" {
            return Reply::text(&["written"]);
        }
        Reply::tool_calls(vec![ScriptedCall::whole(
            "c1",
            "write_file",
            &json!({"path": "child.txt", "content": "from the child\n"}),
        )])
    }))
    .await;
    let app = TestApp::spawn_with(crate::suite::agent::with_model(&mock)).await;
    let root = app.workspace();
    let marker = app.workspace().join("hook-ran");
    hostile_repository(&root, &marker);
    let mut ws = app.ws().await;
    let session = ws.open().await;

    let spawned = ws
        .invoke(
            &session,
            "spawn_agent",
            json!({"message": "write the file", "isolation": "worktree"}),
        )
        .await;
    assert_eq!(spawned["success"], true, "{spawned}");
    let meta = &spawned["structured_metadata"];
    let agent = meta["agent_id"].as_str().unwrap().to_string();
    let branch = format!("agentd/{agent}");
    assert_eq!(meta["worktree"]["branch"], branch.as_str(), "{meta}");
    let tree = root.join(meta["worktree"]["path"].as_str().unwrap());
    let waited = ws
        .invoke(&session, "wait_agent", json!({"ids": [agent]}))
        .await;
    assert!(waited.to_string().contains("written"), "{waited}");
    // The child's edit is in its worktree, not in the session's checkout.
    assert_eq!(
        std::fs::read_to_string(tree.join("child.txt")).unwrap(),
        "from the child\n"
    );
    assert!(!root.join("child.txt").exists());

    let closed = ws
        .invoke(&session, "close_agent", json!({"target": agent}))
        .await;
    assert_eq!(closed["success"], true, "{closed}");
    let settled = &closed["structured_metadata"]["worktree"];
    assert_eq!(settled["kept"], true, "{closed}");
    assert_eq!(
        settled["commit"].as_str().unwrap(),
        git(&root, &["rev-parse", &branch]).trim()
    );
    assert_eq!(
        git(&root, &["show", &format!("{branch}:child.txt")]),
        "from the child\n"
    );
    assert_eq!(
        git(&root, &["log", "--format=%s", "-1", &branch]),
        format!("Work of agent {agent}\n")
    );
    assert!(
        !tree.exists(),
        "the worktree goes at close; the branch stays"
    );
    assert_eq!(status(&root), "");

    // A child that changes nothing leaves neither worktree nor branch.
    let spawned = ws
        .invoke(
            &session,
            "spawn_agent",
            json!({"message": "look only", "isolation": "worktree"}),
        )
        .await;
    let agent = spawned["structured_metadata"]["agent_id"]
        .as_str()
        .unwrap()
        .to_string();
    let tree = root.join(
        spawned["structured_metadata"]["worktree"]["path"]
            .as_str()
            .unwrap(),
    );
    assert!(tree.join("a.txt").exists());
    ws.invoke(&session, "wait_agent", json!({"ids": [agent]}))
        .await;
    let closed = ws
        .invoke(&session, "close_agent", json!({"target": agent}))
        .await;
    assert_eq!(
        closed["structured_metadata"]["worktree"]["kept"], false,
        "{closed}"
    );
    assert!(!tree.exists());
    assert_eq!(
        git(&root, &["branch", "--list", &format!("agentd/{agent}")]),
        ""
    );

    // Deleting the session removes the worktree and branch of a child never closed.
    let kept = ws
        .invoke(
            &session,
            "spawn_agent",
            json!({"message": "write the file", "isolation": "worktree"}),
        )
        .await;
    let orphan = kept["structured_metadata"]["agent_id"]
        .as_str()
        .unwrap()
        .to_string();
    let orphan_tree = root.join(
        kept["structured_metadata"]["worktree"]["path"]
            .as_str()
            .unwrap(),
    );
    ws.invoke(&session, "wait_agent", json!({"ids": [orphan]}))
        .await;
    assert!(orphan_tree.join("child.txt").exists());
    assert_eq!(app.delete_session(&session).await, 204);
    assert!(!orphan_tree.exists());
    assert_eq!(
        git(&root, &["branch", "--list", &format!("agentd/{orphan}")]),
        ""
    );
    let session = ws.open().await;

    // A session outside any repository cannot give one a worktree.
    std::fs::remove_dir_all(root.join(".git")).unwrap();
    let refused = ws
        .invoke(
            &session,
            "spawn_agent",
            json!({"message": "again", "isolation": "worktree"}),
        )
        .await;
    assert_eq!(refused["success"], false, "{refused}");
    assert!(
        refused["output"]
            .as_str()
            .unwrap()
            .contains("not inside a git repository"),
        "{refused}"
    );
    assert!(!marker.exists(), "a repository hook or fsmonitor ran");
}
