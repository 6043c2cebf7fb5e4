//! The tool core end to end: a workspace-bound file tool dispatched through a session snapshot of
//! a base registry, with policies, deferral and the file-safety layer all in the path.

use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};

use agentd::fs_safe::{read_no_follow, resolve_path};
use agentd::tools::{
    DispatchError, Effects, HiddenReason, Tool, ToolContext, ToolError, ToolMeta, ToolPolicy,
    ToolRegistry, ToolResult, ToolState, Workspace,
};
use async_trait::async_trait;
use serde_json::{Value, json};

/// Reads a text file of its workspace, as a cwd-bound tool does.
struct Cat {
    root: PathBuf,
}

#[async_trait]
impl Tool for Cat {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "read_file",
                "Reads a file of the workspace.",
                json!({
                    "type": "object",
                    "properties": {"path": {"type": "string", "description": "relative path"}},
                    "required": ["path"],
                    "additionalProperties": false
                }),
                Effects::NONE,
            )
            .groups(&["fs"])
            .tags(&["fs"])
        });
        &META
    }
    async fn call(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        let requested = args["path"].as_str().unwrap_or_default();
        let rel = resolve_path(&self.root, requested)?;
        let bytes = read_no_follow(&self.root, &rel, 1024 * 1024)?;
        Ok(ToolResult::ok(String::from_utf8_lossy(&bytes)))
    }
    fn rebind_cwd(&self, workspace: &Arc<Workspace>) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(Cat {
            root: workspace.root().to_path_buf(),
        }))
    }
}

/// A tool that is not bound to a directory.
struct WebStub;

#[async_trait]
impl Tool for WebStub {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "web_fetch",
                "Stands in for a web tool.",
                json!({"type": "object"}),
                Effects::REACHES_NETWORK,
            )
            .groups(&["web"])
            .tags(&["web"])
        });
        &META
    }
    async fn call(&self, _ctx: &ToolContext, _args: &Value) -> Result<ToolResult, ToolError> {
        Err(ToolError::unsupported(
            "web_fetch",
            "no provider is configured",
        ))
    }
}

fn base_registry(root: &Path) -> ToolRegistry {
    let mut registry = ToolRegistry::default();
    registry.pin_base_tool("read_file");
    registry
        .register(Arc::new(Cat {
            root: root.to_path_buf(),
        }))
        .unwrap();
    registry.register(Arc::new(WebStub)).unwrap();
    registry
}

#[tokio::test]
async fn a_session_reads_only_inside_its_own_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let alice = dir.path().join("alice");
    let bob = dir.path().join("bob");
    std::fs::create_dir_all(&alice).unwrap();
    std::fs::create_dir_all(&bob).unwrap();
    std::fs::write(alice.join("notes.txt"), "alice's notes").unwrap();
    std::fs::write(bob.join("notes.txt"), "bob's secret").unwrap();
    std::os::unix::fs::symlink(bob.join("notes.txt"), alice.join("link.txt")).unwrap();
    std::os::unix::fs::symlink(&bob, alice.join("bobdir")).unwrap();

    let base = base_registry(dir.path());
    let mut session = base.snapshot_excluding(&[]);
    session.rebind_cwd(&alice);
    let ctx = ToolContext::detached(&alice);

    let ok = session
        .execute_with_context(&ctx, "read_file", &json!({"path": "notes.txt"}))
        .await
        .unwrap();
    assert_eq!((ok.success, ok.output.as_str()), (true, "alice's notes"));

    for (path, kind) in [
        ("link.txt", "symlink"),
        ("bobdir/notes.txt", "symlink"),
        ("../bob/notes.txt", "escapes_root"),
        ("/etc/passwd", "absolute_path"),
    ] {
        let result = session
            .execute_with_context(&ctx, "read_file", &json!({ "path": path }))
            .await
            .unwrap();
        assert!(!result.success, "{path} must be refused");
        assert!(!result.output.contains("secret"), "{path} leaked");
        assert_eq!(
            result.structured_metadata,
            Some(json!({"error": {"kind": kind}})),
            "{path}: {}",
            result.output
        );
    }

    let err = session
        .execute_with_context(&ctx, "read_file", &json!({"path": 7}))
        .await
        .unwrap_err();
    assert!(matches!(err, DispatchError::InvalidArguments { .. }));
}

#[tokio::test]
async fn policies_deferral_and_unsupported_tools_meet_in_one_dispatch_path() {
    let dir = tempfile::tempdir().unwrap();
    let mut base = base_registry(dir.path());
    base.defer_group("group:web");
    let mut session = base.snapshot_excluding(&[]);
    let ctx = ToolContext::detached(dir.path());

    // Calling the deferred web tool activates it; it has no backend and says so, typed.
    let result = session
        .execute_with_context(&ctx, "web_fetch", &json!({}))
        .await
        .unwrap();
    assert!(!result.success);
    assert_eq!(
        result.structured_metadata,
        Some(json!({"error": {"kind": "unsupported"}}))
    );
    assert_eq!(
        session.catalog().get("web_fetch").unwrap().state,
        ToolState::Active
    );
    assert_eq!(
        base.catalog().get("web_fetch").unwrap().state,
        ToolState::Deferred,
        "the base registry keeps its own state"
    );

    // The soft policy hides and refuses; the hard one removes.
    session.set_provider_policy(Some(ToolPolicy {
        deny: vec!["web_*".into()],
        ..ToolPolicy::default()
    }));
    let names: Vec<String> = session.specs().iter().map(|s| s.name.clone()).collect();
    assert_eq!(names, ["read_file"]);
    let err = session
        .execute_with_context(&ctx, "web_fetch", &json!({}))
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        DispatchError::PolicyDenied {
            reason: HiddenReason::ProviderPolicy,
            ..
        }
    ));

    base.apply_policy(ToolPolicy {
        deny: vec!["group:fs".into()],
        ..ToolPolicy::default()
    });
    let mut restricted = base.snapshot_excluding(&[]);
    let err = restricted
        .execute_with_context(&ctx, "read_file", &json!({"path": "x"}))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "policy_denied");
    let catalog = serde_json::to_value(&*restricted.catalog()).unwrap();
    assert_eq!(
        catalog["entries"][0],
        json!({"name": "read_file", "description": "Reads a file of the workspace.",
               "tags": ["fs"], "group": "fs", "concurrency": "safe",
               "effects": {"writes_files": false, "runs_commands": false, "reaches_network": false},
               "spawn_only": false, "state": "hidden", "reason": "policy_deny"})
    );
}
