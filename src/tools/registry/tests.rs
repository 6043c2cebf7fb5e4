//! Unit tests of the registry: specs, deferral, snapshots, policies and the dispatch path.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use serde_json::{Value, json};

use super::*;
use crate::tools::{
    ConcurrencyClass, Effects, ToolContext, ToolError, ToolEvent, ToolMeta, ToolResult,
};

/// A configurable tool that counts its calls.
struct Probe {
    meta: ToolMeta,
    cwd: Option<PathBuf>,
    behaviour: Behaviour,
    calls: AtomicUsize,
}

#[derive(Clone, Copy)]
enum Behaviour {
    Echo,
    ModelError,
    Fatal,
    Hang,
    Progress,
    StopsWhenAsked,
    /// Answers the directory it is bound to.
    ReportCwd,
}

impl Probe {
    /// A probe called `name`; named after a built-in, it is in that tool's groups (the
    /// framework's tests name no built-in, so the few they stand in for are listed here).
    fn new(name: &str) -> Self {
        let groups: Vec<&'static str> = match name {
            "read_file" | "write_file" | "edit_file" | "diff_edit" | "apply_patch" => vec!["fs"],
            "glob" | "grep" | "list_dir" => vec!["search"],
            "shell" | "exec_command" | "write_stdin" => vec!["runtime", "delegated"],
            "web_fetch" | "web_search" => vec!["web"],
            "spawn_agent" => vec!["sessions", "delegated"],
            "send_input" | "resume_agent" | "wait_agent" | "close_agent" => vec!["sessions"],
            "request_user_input" => vec!["delegated"],
            _ => Vec::new(),
        };
        Self {
            meta: ToolMeta::new(name, "a probe", json!({"type": "object"}), Effects::NONE)
                .groups(&groups),
            cwd: None,
            behaviour: Behaviour::Echo,
            calls: AtomicUsize::new(0),
        }
    }
    fn tags(mut self, tags: &[&'static str]) -> Self {
        self.meta = self.meta.tags(tags);
        self
    }
    fn schema(mut self, schema: Value) -> Self {
        self.meta.input_schema = schema.into();
        self
    }
    fn cwd(mut self, cwd: &str) -> Self {
        self.cwd = Some(PathBuf::from(cwd));
        self
    }
    fn behaviour(mut self, behaviour: Behaviour) -> Self {
        self.behaviour = behaviour;
        self
    }
    fn arc(self) -> Arc<Probe> {
        Arc::new(self)
    }
}

#[async_trait]
impl Tool for Probe {
    fn meta(&self) -> &ToolMeta {
        &self.meta
    }
    async fn call(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        match self.behaviour {
            Behaviour::Echo => Ok(ToolResult::ok(format!("{} {args}", self.meta.name))),
            Behaviour::ModelError => Err(ToolError::model("not_found", "no such file: a.txt")),
            Behaviour::Fatal => Err(ToolError::Fatal("disk on fire".into())),
            Behaviour::Hang => std::future::pending().await,
            Behaviour::StopsWhenAsked => {
                ctx.cancel.cancelled().await;
                Ok(ToolResult::failure("stopped early; spent 3 tokens"))
            }
            Behaviour::Progress => {
                ctx.progress("halfway", Some(0.5)).await;
                ctx.output("chunk").await;
                Ok(ToolResult::ok("done"))
            }
            Behaviour::ReportCwd => Ok(ToolResult::ok(format!("{:?}", self.cwd))),
        }
    }
    fn rebind_cwd(&self, workspace: &Arc<Workspace>) -> Option<Arc<dyn Tool>> {
        self.cwd.as_ref()?;
        let mut copy = Probe::new(&self.meta.name)
            .tags(&self.meta.tags)
            .behaviour(self.behaviour);
        copy.cwd = Some(workspace.root().to_path_buf());
        Some(Arc::new(copy))
    }
}

fn registry_with(names: &[&str]) -> ToolRegistry {
    let mut registry = ToolRegistry::default();
    for name in names {
        registry.register(Probe::new(name).arc()).unwrap();
    }
    registry
}

fn spec_names(registry: &ToolRegistry) -> Vec<String> {
    registry.specs().iter().map(|s| s.name.clone()).collect()
}

fn ctx() -> ToolContext {
    ToolContext::detached(".")
}

fn numbered(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i:02}")).collect()
}

#[test]
fn specs_keep_the_order_tools_became_visible_in() {
    let mut registry = registry_with(&["zeta", "grep", "alpha", "read_file"]);
    registry.pin_base_tool("read_file");
    assert_eq!(
        spec_names(&registry),
        ["zeta", "grep", "alpha", "read_file"],
        "registration order, never a map's"
    );
    let spec = &registry.specs()[0];
    assert_eq!(spec.description, "a probe");
    assert_eq!(*spec.input_schema, json!({"type": "object"}));

    // Deferring and bringing a tool back appends it; the others do not move.
    registry.defer_tool("grep");
    assert_eq!(spec_names(&registry), ["zeta", "alpha", "read_file"]);
    registry.activate("grep");
    assert_eq!(
        spec_names(&registry),
        ["zeta", "alpha", "read_file", "grep"]
    );
    // Re-registering a tool (a rebuilt MCP tool, say) keeps its place.
    registry.register(Probe::new("zeta").arc()).unwrap();
    assert_eq!(
        spec_names(&registry),
        ["zeta", "alpha", "read_file", "grep"]
    );
    registry.unregister("zeta");
    registry.register(Probe::new("zeta").arc()).unwrap();
    assert_eq!(
        spec_names(&registry),
        ["alpha", "read_file", "grep", "zeta"]
    );
    // A snapshot starts from the same order.
    let child = registry.snapshot_excluding(&[]);
    assert_eq!(spec_names(&child), spec_names(&registry));
}

#[test]
fn an_eviction_removes_tools_without_reordering_the_rest() {
    let mut parent = registry_with(
        &numbered("t", 8)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    parent.configure_lifecycle(5, 2, Some(Vec::<String>::new()));
    let mut registry = parent.snapshot_excluding(&[]);
    // A fresh session: nothing was used yet, so the excess goes at the first boundary.
    registry.tick();
    registry.prepare("t00", &json!({})).unwrap();
    registry.prepare("t05", &json!({})).unwrap();
    let evicted = registry.auto_evict();
    assert_eq!(
        evicted,
        ["t07", "t06", "t04"],
        "never-used tools first, from the end of the list"
    );
    assert_eq!(spec_names(&registry), ["t00", "t01", "t02", "t03", "t05"]);
}

#[test]
fn specs_are_cached_until_a_mutation() {
    let mut registry = registry_with(&["a", "b"]);
    let first = registry.specs();
    assert!(
        Arc::ptr_eq(&first, &registry.specs()),
        "no rebuild without change"
    );
    registry.tick();
    registry.prepare("a", &json!({})).unwrap();
    assert!(
        Arc::ptr_eq(&first, &registry.specs()),
        "use and ticks keep the cache"
    );

    registry.register(Probe::new("c").arc()).unwrap();
    let second = registry.specs();
    assert!(!Arc::ptr_eq(&first, &second));
    assert_eq!(second.len(), 3);

    registry.unregister("c");
    let third = registry.specs();
    assert!(!Arc::ptr_eq(&second, &third));
    assert_eq!(third.len(), 2);
}

#[test]
fn defer_and_activate_skip_unknown_names_and_spare_base_tools() {
    let mut registry = registry_with(&["web_fetch", "read_file"]);
    registry.pin_base_tool("read_file");
    assert_eq!(
        registry.defer_group("group:web"),
        ["web_fetch"],
        "web_search not registered"
    );
    assert!(registry.defer_group("group:nonexistent").is_empty());
    assert!(
        registry.defer_group("group:fs").is_empty(),
        "base tools are never deferred"
    );
    assert_eq!(spec_names(&registry), ["read_file"]);
    assert!(registry.activate("no_such_tool").is_empty());
    assert!(registry.activate("group:nonexistent").is_empty());
    assert_eq!(
        registry.activate("web"),
        Vec::<String>::new(),
        "bare words are tool names"
    );
    assert_eq!(registry.activate("group:web"), ["web_fetch"]);
    assert_eq!(spec_names(&registry), ["read_file", "web_fetch"]);
}

#[tokio::test]
async fn calling_a_deferred_tool_activates_its_whole_group() {
    let mut registry = registry_with(&["web_fetch", "web_search", "grep"]);
    registry.defer_group("group:web");
    assert_eq!(registry.deferred_names(), ["web_fetch", "web_search"]);
    let before = registry.specs();

    let result = registry
        .execute_with_context(&ctx(), "web_fetch", &json!({"url": "x"}))
        .await
        .unwrap();
    assert!(result.success);
    assert!(registry.deferred_names().is_empty());
    assert_eq!(spec_names(&registry), ["grep", "web_fetch", "web_search"]);
    assert!(!Arc::ptr_eq(&before, &registry.specs()));
}

#[tokio::test]
async fn calling_a_deferred_ungrouped_tool_activates_only_it() {
    let mut registry = registry_with(&["custom_a", "custom_b"]);
    registry.deferred.extend(["custom_a", "custom_b"]);
    registry.changed();
    registry
        .execute_with_context(&ctx(), "custom_a", &json!({}))
        .await
        .unwrap();
    assert_eq!(registry.deferred_names(), ["custom_b"]);
}

#[test]
fn auto_evict_defers_the_oldest_idle_tool_and_a_call_brings_it_back() {
    let names = numbered("t", 16);
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut registry = registry_with(&refs);
    // Use every tool but t00 later, so t00 is the oldest.
    for name in &names[1..] {
        registry.tick();
        registry.prepare(name, &json!({})).unwrap();
    }
    for _ in 0..5 {
        registry.tick();
    }
    assert_eq!(registry.auto_evict(), ["t00"]);
    assert_eq!(registry.deferred_names(), ["t00"]);
    assert_eq!(registry.specs().len(), 15);
    assert!(registry.auto_evict().is_empty(), "back at the limit");

    registry.prepare("t00", &json!({})).unwrap();
    assert_eq!(registry.specs().len(), 16);
    registry.tick();
    let evicted = registry.auto_evict();
    assert_eq!(evicted.len(), 1);
    assert_ne!(
        evicted,
        ["t00"],
        "just-used tool is protected by the idle threshold"
    );
}

#[test]
fn spawn_only_and_pinned_tools_are_never_evicted() {
    let names = numbered("t", 17);
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut registry = ToolRegistry::default();
    registry.pin_base_tool("t00"); // pinned before it exists
    for name in &refs {
        registry.register(Probe::new(name).arc()).unwrap();
    }
    registry.mark_spawn_only("t01");
    registry.mark_spawn_only("not_registered");
    assert!(!registry.is_spawn_only("not_registered"));
    // The mark waits for the tool, and survives its going away and coming back.
    registry
        .register(Probe::new("not_registered").arc())
        .unwrap();
    assert!(registry.is_spawn_only("not_registered"));
    registry.unregister("not_registered");
    assert!(!registry.is_spawn_only("not_registered"));
    registry
        .register(Probe::new("not_registered").arc())
        .unwrap();
    assert!(registry.is_spawn_only("not_registered"));
    registry.unregister("not_registered");
    for _ in 0..10 {
        registry.tick();
    }
    // Equally idle: from the end of the list, past the pinned t00 and the spawn_only t01.
    assert_eq!(registry.auto_evict(), ["t16", "t15"]);
}

#[test]
fn an_all_base_registry_evicts_nothing() {
    let names = numbered("t", 20);
    let mut registry = ToolRegistry::default();
    for name in &names {
        registry.pin_base_tool(name.clone());
        registry.register(Probe::new(name).arc()).unwrap();
    }
    for _ in 0..50 {
        registry.tick();
    }
    assert!(registry.auto_evict().is_empty());
    assert_eq!(registry.specs().len(), 20);
}

#[test]
fn snapshots_share_tools_but_keep_their_own_lru() {
    let names = numbered("t", 16);
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut parent = registry_with(&refs);
    parent.pin_base_tool("t15");
    parent.tick();
    parent.prepare("t00", &json!({})).unwrap();

    let mut a = parent.snapshot_excluding(&[]);
    let mut b = parent.snapshot_excluding(&[]);
    assert!(Arc::ptr_eq(
        a.get("t03").unwrap(),
        parent.get("t03").unwrap()
    ));
    assert_eq!(a.lifecycle().iteration(), 0, "counters start fresh");
    assert!(a.lifecycle().is_base("t15"), "base tools carry over");

    // Both use t02..t14 once; then session A keeps using t00, session B t01.
    for session in [&mut a, &mut b] {
        session.tick();
        for name in &names[2..15] {
            session.prepare(name, &json!({})).unwrap();
        }
    }
    for _ in 0..8 {
        a.tick();
        a.prepare("t00", &json!({})).unwrap();
        b.tick();
        b.prepare("t01", &json!({})).unwrap();
    }
    assert_eq!(a.auto_evict(), ["t01"]);
    assert_eq!(b.auto_evict(), ["t00"]);
    assert!(
        parent.deferred_names().is_empty(),
        "the parent is untouched"
    );
    assert_eq!(parent.lifecycle().iteration(), 1);
}

/// A session's snapshot copies nothing it does not change: the order tools were shown in and
/// the base tools are the parent's own until the session shows or pins one of its own, and
/// then only that session's copy changes.
#[test]
fn snapshots_share_the_shown_order_and_base_tools_until_they_change_them() {
    let mut parent = registry_with(&["a", "b"]);
    parent.pin_base_tool("a");
    let mut session = parent.snapshot_excluding(&[]);
    let other = parent.snapshot_excluding(&[]);
    assert!(Arc::ptr_eq(&session.shown_at, &parent.shown_at));
    assert!(Arc::ptr_eq(
        &session.lifecycle.base_tools,
        &other.lifecycle.base_tools
    ));

    session.register(Probe::new("c").arc()).unwrap();
    assert!(!Arc::ptr_eq(&session.shown_at, &parent.shown_at));
    assert!(!other.shown_at.contains_key("c") && !parent.shown_at.contains_key("c"));
    assert_eq!(
        spec_names(&session),
        ["a", "b", "c"],
        "a tool shown later goes last"
    );
    assert!(Arc::ptr_eq(&other.shown_at, &parent.shown_at));

    session.pin_base_tool("c");
    assert!(session.lifecycle().is_base("c"));
    assert!(!other.lifecycle().is_base("c") && !parent.lifecycle().is_base("c"));
}

#[test]
fn snapshots_share_the_deferred_and_spawn_only_sets_until_they_change_them() {
    let mut parent = registry_with(&["web_fetch", "web_search", "run_pipeline", "shell"]);
    parent.defer_group("group:web");
    parent.mark_spawn_only("run_pipeline");
    let mut session = parent.snapshot_excluding(&[]);
    let other = parent.snapshot_excluding(&[]);
    assert!(session.deferred.shares(&parent.deferred));
    assert!(other.spawn_only.shares(&parent.spawn_only));

    // Unregistering a tool in neither set copies neither.
    let mut plain = parent.snapshot_excluding(&[]);
    assert!(plain.unregister("shell").is_some());
    assert!(plain.deferred.shares(&parent.deferred));
    assert!(plain.spawn_only.shares(&parent.spawn_only));

    // A snapshot that leaves a name out has a set of its own.
    let narrowed = parent.snapshot_excluding(&["web_search"]);
    assert!(!narrowed.deferred.shares(&parent.deferred));
    assert_eq!(narrowed.deferred_names(), ["web_fetch"]);
    assert!(narrowed.spawn_only.shares(&parent.spawn_only));

    // Calling a deferred tool activates its group in that session only.
    assert!(session.prepare("web_fetch", &json!({})).is_ok());
    assert!(!session.deferred.shares(&parent.deferred));
    assert!(session.deferred_names().is_empty());
    assert_eq!(other.deferred_names(), ["web_fetch", "web_search"]);
    assert_eq!(parent.deferred_names(), ["web_fetch", "web_search"]);
}

#[test]
fn snapshot_excludes_names_and_groups_and_copies_state() {
    let mut parent = registry_with(&["shell", "spawn_agent", "web_fetch", "grep", "run_pipeline"]);
    parent.defer_group("group:web");
    parent.mark_spawn_only("run_pipeline");
    parent.set_provider_policy(Some(ToolPolicy {
        deny: vec!["grep".into()],
        ..ToolPolicy::default()
    }));
    parent.set_max_args_bytes(10);

    let mut child = parent.snapshot_excluding(&["group:delegated"]);
    assert!(!child.contains("shell") && !child.contains("spawn_agent"));
    assert_eq!(child.deferred_names(), ["web_fetch"]);
    assert!(child.is_spawn_only("run_pipeline"));
    assert!(matches!(
        child.prepare("grep", &json!({})),
        Err(DispatchError::PolicyDenied {
            reason: HiddenReason::ProviderPolicy,
            ..
        })
    ));
    assert!(matches!(
        child.prepare("run_pipeline", &json!({"big": "0123456789"})),
        Err(DispatchError::ArgsTooLarge { limit: 10, .. })
    ));
    assert_eq!(
        child.catalog().get("shell").map(|e| e.name().to_string()),
        None
    );

    let child = parent.snapshot_excluding(&["web_*", "grep"]);
    assert!(!child.contains("web_fetch") && !child.contains("grep"));
    assert!(child.deferred_names().is_empty());
}

#[tokio::test]
async fn rebind_cwd_rebuilds_only_cwd_bound_tools() {
    let mut registry = ToolRegistry::default();
    registry
        .register(
            Probe::new("read_file")
                .cwd("/old")
                .behaviour(Behaviour::ReportCwd)
                .arc(),
        )
        .unwrap();
    registry.register(Probe::new("web_fetch").arc()).unwrap();
    let mut child = registry.snapshot_excluding(&[]);
    child.rebind_cwd(Path::new("/new"));

    // A probe told to report its directory answers with the one it is bound to.
    let cwd_of = async |tool: &Arc<dyn Tool>| tool.call(&ctx(), &json!({})).await.unwrap().output;
    let rebound = child.get("read_file").unwrap();
    assert!(!Arc::ptr_eq(rebound, registry.get("read_file").unwrap()));
    assert_eq!(
        cwd_of(rebound).await,
        format!("{:?}", Some(Path::new("/new")))
    );
    assert!(Arc::ptr_eq(
        child.get("web_fetch").unwrap(),
        registry.get("web_fetch").unwrap()
    ));
    let original = registry.get("read_file").unwrap();
    assert_eq!(
        cwd_of(original).await,
        format!("{:?}", Some(Path::new("/old"))),
        "parent untouched"
    );
}

#[tokio::test]
async fn snapshots_share_their_parents_policies_and_removed_tools() {
    let mut parent = registry_with(&["shell", "grep", "web_fetch"]);
    parent.apply_policy(ToolPolicy {
        deny: vec!["shell".into()],
        ..ToolPolicy::default()
    });
    parent.set_provider_policy(Some(ToolPolicy {
        deny: vec!["web_fetch".into()],
        ..ToolPolicy::default()
    }));
    let mut session = parent.snapshot_excluding(&[]);
    let same = |a: &Option<Arc<ToolPolicy>>, b: &Option<Arc<ToolPolicy>>| match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        _ => false,
    };
    assert!(same(&session.hard_policy, &parent.hard_policy));
    assert!(same(&session.provider_policy, &parent.provider_policy));
    assert!(session.removed.shares(&parent.removed));

    // Registering a tool the policy allows copies nothing; one it refuses changes only the
    // session's own removed set, and the refusal holds there.
    session.register(Probe::new("glob").arc()).unwrap();
    assert!(session.removed.shares(&parent.removed));
    session.narrow(ToolPolicy {
        deny: vec!["grep".into()],
        ..ToolPolicy::default()
    });
    assert!(!session.removed.shares(&parent.removed));
    assert!(parent.removed.contains_key("shell") && !parent.removed.contains_key("grep"));
    let err = session
        .execute_with_context(&ctx(), "grep", &json!({}))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "policy_denied");
    assert!(parent.get("grep").is_some());
}

#[tokio::test]
async fn hard_policy_removes_tools_for_good_and_answers_policy_denied() {
    let mut registry = registry_with(&["shell", "web_fetch", "web_search", "grep"]);
    registry.defer_group("group:web");
    registry.mark_spawn_only("web_search");
    let removed = registry.apply_policy(ToolPolicy {
        allow: vec!["grep".into(), "web_*".into()],
        deny: vec!["web_search".into()],
        ..ToolPolicy::default()
    });
    assert_eq!(removed, ["shell", "web_search"]);
    assert!(registry.get("shell").is_none());
    assert!(!registry.is_spawn_only("web_search"));
    assert_eq!(registry.deferred_names(), ["web_fetch"]);

    let err = registry
        .execute_with_context(&ctx(), "shell", &json!({}))
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        DispatchError::PolicyDenied {
            reason: HiddenReason::PolicyDeny,
            ..
        }
    ));
    assert_eq!(err.kind(), "policy_denied");
    let err = registry
        .execute_with_context(&ctx(), "shel", &json!({}))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "unknown_tool");

    let catalog = registry.catalog();
    let hidden: Vec<(&str, HiddenReason)> = catalog
        .hidden()
        .map(|(entry, reason)| (entry.name(), reason))
        .collect();
    assert_eq!(
        hidden,
        [
            ("shell", HiddenReason::PolicyDeny),
            ("web_search", HiddenReason::PolicyDeny)
        ]
    );

    // A later registration of a refused tool stays refused.
    registry.register(Probe::new("shell").arc()).unwrap();
    assert!(!registry.contains("shell"));
}

#[tokio::test]
async fn provider_policy_hides_and_refuses_but_keeps_the_tool() {
    let web = Probe::new("web_fetch").tags(&["web"]).arc();
    let mut registry = ToolRegistry::default();
    registry.register(web.clone()).unwrap();
    registry
        .register(Probe::new("grep").tags(&["search", "code"]).arc())
        .unwrap();
    registry
        .register(Probe::new("shell").tags(&["runtime"]).arc())
        .unwrap();
    registry.register(Probe::new("plain").arc()).unwrap();
    registry.set_provider_policy(Some(ToolPolicy {
        deny: vec!["shell".into()],
        require_tags: vec!["code".into()],
        ..ToolPolicy::default()
    }));

    assert_eq!(spec_names(&registry), ["grep", "plain"]);
    assert!(registry.contains("web_fetch") && registry.contains("shell"));
    let catalog = registry.catalog();
    assert_eq!(
        catalog.get("shell").unwrap().state,
        ToolState::Hidden(HiddenReason::ProviderPolicy)
    );
    assert_eq!(
        catalog.get("web_fetch").unwrap().state,
        ToolState::Hidden(HiddenReason::RequireTags)
    );
    let err = registry
        .execute_with_context(&ctx(), "web_fetch", &json!({}))
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        DispatchError::PolicyDenied {
            reason: HiddenReason::RequireTags,
            ..
        }
    ));
    assert_eq!(
        web.calls.load(Ordering::SeqCst),
        0,
        "refused before running"
    );

    registry.set_provider_policy(None);
    assert_eq!(
        spec_names(&registry),
        ["web_fetch", "grep", "shell", "plain"]
    );
    registry
        .execute_with_context(&ctx(), "web_fetch", &json!({}))
        .await
        .unwrap();
    assert_eq!(web.calls.load(Ordering::SeqCst), 1);
}

#[test]
fn context_filter_trims_specs_and_keeps_untagged_tools() {
    let mut registry = ToolRegistry::default();
    registry
        .register(Probe::new("grep").tags(&["search"]).arc())
        .unwrap();
    registry
        .register(Probe::new("web_fetch").tags(&["web"]).arc())
        .unwrap();
    registry.register(Probe::new("tool_search").arc()).unwrap();
    registry.set_context_filter(vec!["search".into()]);
    assert_eq!(spec_names(&registry), ["grep", "tool_search"]);
    assert_eq!(
        registry.catalog().get("web_fetch").unwrap().state,
        ToolState::Hidden(HiddenReason::ContextFilter)
    );
    registry.set_context_filter(Vec::new());
    assert_eq!(registry.specs().len(), 3);
}

#[tokio::test]
async fn checks_run_in_the_documented_order() {
    let mut registry = registry_with(&["web_fetch", "web_search", "x_tool"]);
    registry.set_max_args_bytes(16);
    registry.set_provider_policy(Some(ToolPolicy {
        deny: vec!["x*".into()],
        ..ToolPolicy::default()
    }));
    let big = json!({"data": "0123456789abcdef"});

    // Provider policy comes before the size check.
    let err = registry.prepare("x_tool", &big).unwrap_err();
    assert_eq!(err.kind(), "policy_denied");
    // A name no tool has is unknown, even when a policy pattern would match it.
    assert_eq!(
        registry.prepare("xyz", &json!({})).unwrap_err().kind(),
        "unknown_tool"
    );
    // Size comes before the unknown-tool check.
    assert_eq!(
        registry.prepare("nope", &big).unwrap_err().kind(),
        "args_too_large"
    );
    // A deferred tool is activated even when its arguments are then refused.
    registry.defer_group("group:web");
    assert_eq!(
        registry.prepare("web_fetch", &big).unwrap_err().kind(),
        "args_too_large"
    );
    assert!(registry.deferred_names().is_empty());
}

#[tokio::test]
async fn oversized_arguments_are_refused_with_their_exact_size() {
    let probe = Probe::new("write_file").arc();
    let mut registry = ToolRegistry::default();
    registry.register(probe.clone()).unwrap();
    let args = json!({"content": "x".repeat(2 * 1024 * 1024)});
    let err = registry
        .execute_with_context(&ctx(), "write_file", &args)
        .await
        .unwrap_err();
    match &err {
        DispatchError::ArgsTooLarge { size, limit, .. } => {
            assert_eq!(*size, serde_json::to_vec(&args).unwrap().len());
            assert_eq!(*limit, 1_048_576);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(probe.calls.load(Ordering::SeqCst), 0);
    let result = err.to_tool_result();
    assert!(!result.success);
    assert_eq!(
        result.structured_metadata,
        Some(json!({"error": {"kind": "args_too_large"}}))
    );
}

#[tokio::test]
async fn schema_violations_name_the_failing_path() {
    let schema = json!({
        "type": "object",
        "properties": {"edits": {"type": "array", "items": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"]
        }}},
        "required": ["edits"]
    });
    let probe = Probe::new("multi_edit").schema(schema).arc();
    let mut registry = ToolRegistry::default();
    registry.register(probe.clone()).unwrap();
    let err = registry
        .execute_with_context(
            &ctx(),
            "multi_edit",
            &json!({"edits": [{"path": "a"}, {"path": 5}]}),
        )
        .await
        .unwrap_err();
    match &err {
        DispatchError::InvalidArguments { error, .. } => {
            assert_eq!(error.path, "/edits/1/path")
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(err.to_string().contains("/edits/1/path"), "{err}");
    assert_eq!(probe.calls.load(Ordering::SeqCst), 0);
    registry
        .execute_with_context(&ctx(), "multi_edit", &json!({"edits": [{"path": "a"}]}))
        .await
        .unwrap();
    assert_eq!(probe.calls.load(Ordering::SeqCst), 1);
}

#[test]
fn an_invalid_schema_is_refused_at_registration() {
    let mut registry = ToolRegistry::default();
    let err = registry
        .register(Probe::new("broken").schema(json!({"type": 12})).arc())
        .unwrap_err();
    assert!(err.to_string().contains("broken"), "{err}");
    assert!(registry.is_empty());
}

#[tokio::test]
async fn model_errors_become_results_and_fatal_errors_do_not() {
    let mut registry = ToolRegistry::default();
    registry
        .register(
            Probe::new("read_file")
                .behaviour(Behaviour::ModelError)
                .arc(),
        )
        .unwrap();
    registry
        .register(Probe::new("broken").behaviour(Behaviour::Fatal).arc())
        .unwrap();
    let result = registry
        .execute_with_context(&ctx(), "read_file", &json!({}))
        .await
        .unwrap();
    assert!(!result.success);
    assert_eq!(result.output, "no such file: a.txt");
    assert_eq!(
        result.structured_metadata,
        Some(json!({"error": {"kind": "not_found"}}))
    );
    let err = registry
        .execute_with_context(&ctx(), "broken", &json!({}))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "fatal");
    assert!(!err.is_refusal());
}

#[tokio::test]
async fn cancellation_stops_a_tool_that_ignores_it() {
    let mut registry = ToolRegistry::default();
    registry
        .register(Probe::new("hang").behaviour(Behaviour::Hang).arc())
        .unwrap();
    let ctx = ctx();
    let call = registry.prepare("hang", &json!({})).unwrap();
    let cancel = ctx.cancel.clone();
    let args = json!({});
    let (outcome, ()) = tokio::join!(call.run(&ctx, &args), async move { cancel.cancel() });
    assert!(matches!(outcome, Err(DispatchError::Cancelled { .. })));
}

#[tokio::test]
async fn a_tool_that_honours_cancellation_answers_for_itself() {
    let mut registry = ToolRegistry::default();
    registry
        .register(
            Probe::new("polite")
                .behaviour(Behaviour::StopsWhenAsked)
                .arc(),
        )
        .unwrap();
    let ctx = ctx();
    let call = registry.prepare("polite", &json!({})).unwrap();
    let cancel = ctx.cancel.clone();
    let args = json!({});
    let (outcome, ()) = tokio::join!(call.run(&ctx, &args), async move { cancel.cancel() });
    let result = outcome.unwrap();
    assert!(!result.success);
    assert_eq!(result.output, "stopped early; spent 3 tokens");
}

#[tokio::test]
async fn tools_report_progress_and_output_through_the_context() {
    let mut registry = ToolRegistry::default();
    registry
        .register(Probe::new("slow").behaviour(Behaviour::Progress).arc())
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    let ctx = ToolContext {
        session_id: "s1".into(),
        tool_call_id: "call-7".into(),
        events: Some(tx),
        ..ToolContext::detached(".")
    };
    let result = registry
        .execute_with_context(&ctx, "slow", &json!({}))
        .await
        .unwrap();
    assert_eq!(result.output, "done");
    assert!(matches!(
        rx.recv().await,
        Some(ToolEvent::Progress { tool_call_id, message, fraction: Some(f) })
            if tool_call_id == "call-7" && message == "halfway" && f == 0.5
    ));
    assert!(matches!(
        rx.recv().await,
        Some(ToolEvent::Output { tool_call_id, text })
            if tool_call_id == "call-7" && text == "chunk"
    ));
}

#[test]
fn prepared_calls_report_spawn_only_and_count_as_use() {
    let mut registry = registry_with(&["run_pipeline"]);
    registry.mark_spawn_only("run_pipeline");
    for _ in 0..3 {
        registry.tick();
    }
    let call = registry.prepare("run_pipeline", &json!({})).unwrap();
    assert!(call.spawn_only());
    assert_eq!(registry.lifecycle().last_used.get("run_pipeline"), Some(&3));
    registry.clear_spawn_only();
    assert!(
        !registry
            .prepare("run_pipeline", &json!({}))
            .unwrap()
            .spawn_only()
    );
}

#[test]
fn the_catalog_cell_follows_every_mutation() {
    let mut registry = registry_with(&["web_fetch", "grep"]);
    let cell = registry.catalog_cell();
    assert_eq!(
        cell.load().names_in(ToolState::Active),
        ["grep", "web_fetch"]
    );
    registry.defer_group("group:web");
    assert_eq!(cell.load().names_in(ToolState::Deferred), ["web_fetch"]);
    registry.register(Probe::new("glob").arc()).unwrap();
    assert_eq!(cell.load().names_in(ToolState::Active), ["glob", "grep"]);
    let snapshot_cell = registry.snapshot_excluding(&[]).catalog_cell();
    registry.activate("group:web");
    assert_eq!(
        cell.load().names_in(ToolState::Deferred),
        Vec::<&str>::new()
    );
    assert_eq!(
        snapshot_cell.load().names_in(ToolState::Deferred),
        ["web_fetch"],
        "a snapshot has its own catalog"
    );
    let entry = serde_json::to_value(cell.load().get("grep").unwrap()).unwrap();
    assert_eq!(
        entry,
        json!({"name": "grep", "description": "a probe", "tags": [], "group": "search",
               "concurrency": "safe",
               "effects": {"writes_files": false, "runs_commands": false, "reaches_network": false},
               "spawn_only": false, "state": "active"})
    );
}

#[test]
fn groups_defer_only_when_crowded() {
    let mut names = numbered("t", 14);
    names.push("web_fetch".into());
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut registry = registry_with(&refs);
    let groups = vec!["group:web".to_string()];
    assert!(
        registry.defer_groups_if_crowded(&groups).is_empty(),
        "15 fit"
    );
    registry.register(Probe::new("web_search").arc()).unwrap();
    assert_eq!(
        registry.defer_groups_if_crowded(&groups),
        ["web_fetch", "web_search"]
    );
}

#[test]
fn concurrency_class_defaults_to_safe() {
    assert_eq!(Probe::new("x").meta().concurrency, ConcurrencyClass::Safe);
}

#[test]
fn activation_requests_from_tools_apply_before_the_next_iteration() {
    let mut registry = registry_with(&["web_fetch", "web_search", "custom"]);
    registry.defer_group("group:web");
    registry.deferred.insert("custom");
    registry.changed();
    let cell = registry.catalog_cell();
    cell.request_activation(["group:web".to_string(), "nope".to_string()]);
    assert_eq!(registry.specs().len(), 0, "nothing applied yet");
    registry.tick();
    assert_eq!(spec_names(&registry), ["web_fetch", "web_search"]);
    cell.request_activation(["custom".to_string()]);
    registry.prepare("web_fetch", &json!({})).unwrap();
    assert_eq!(registry.deferred_names(), Vec::<&str>::new());
}

#[test]
fn the_deferral_tool_follows_the_deferred_set() {
    let mut registry = registry_with(&["web_fetch", "web_search", "grep"]);
    let factory: DeferralToolFactory =
        Arc::new(|deferred: &[&str]| Arc::new(Listing::of(deferred)) as Arc<dyn Tool>);
    registry.set_deferral_tool("activate_tools", factory);
    assert!(!registry.contains("activate_tools"), "nothing deferred yet");
    registry.defer_group("group:web");
    let listed = registry
        .get("activate_tools")
        .unwrap()
        .description()
        .to_string();
    assert_eq!(listed, "activate_tools[web_fetch,web_search]");
    let mut child = registry.snapshot_excluding(&[]);
    child.activate("web_fetch");
    assert_eq!(
        child.get("activate_tools").unwrap().description(),
        "activate_tools[web_search]"
    );
    child.activate("web_search");
    assert!(!child.contains("activate_tools"));
    assert!(
        registry.contains("activate_tools"),
        "the parent keeps its own"
    );
}

#[test]
fn a_new_listing_compiles_the_deferral_tools_schema_only_when_it_changed() {
    let mut registry = registry_with(&["web_fetch", "web_search", "grep"]);
    // The schema names the deferred tools only while more than one is deferred.
    let factory: DeferralToolFactory = Arc::new(|deferred: &[&str]| {
        let mut listing = Listing::of(deferred);
        if deferred.len() > 1 {
            listing.meta.input_schema = json!({"type": "object", "description": "several"}).into();
        }
        Arc::new(listing) as Arc<dyn Tool>
    });
    registry.set_deferral_tool("activate_tools", factory);
    let validator = |registry: &ToolRegistry| {
        Arc::clone(&registry.tools.get("activate_tools").unwrap().validator)
    };
    registry.defer_group("group:web");
    let several = validator(&registry);
    registry.defer_tool("grep");
    assert_eq!(
        registry.get("activate_tools").unwrap().description(),
        "activate_tools[grep,web_fetch,web_search]"
    );
    assert!(
        Arc::ptr_eq(&several, &validator(&registry)),
        "a new listing with the same schema keeps its validator"
    );
    registry.activate("grep");
    registry.activate("web_fetch");
    let one = validator(&registry);
    assert!(!Arc::ptr_eq(&several, &one), "a new schema is compiled");
    assert!(registry.prepare("activate_tools", &json!({})).is_ok());
}

#[test]
fn one_schema_is_compiled_once_for_a_registry_and_its_snapshots() {
    let validator = |registry: &ToolRegistry, name: &str| {
        Arc::clone(&registry.tools.get(name).unwrap().validator)
    };
    let schema = json!({"type": "object", "properties": {"q": {"type": "string"}}});
    let mut base = ToolRegistry::default();
    base.register(Probe::new("mcp_a").schema(schema.clone()).arc())
        .unwrap();
    let mut session = base.snapshot_excluding(&[]);
    // A session's own server listing a tool of the same shape, then listing it again.
    session
        .register(Probe::new("mcp_b").schema(schema.clone()).arc())
        .unwrap();
    let first = validator(&session, "mcp_b");
    assert!(Arc::ptr_eq(&validator(&base, "mcp_a"), &first));
    session
        .register(Probe::new("mcp_b").schema(schema.clone()).arc())
        .unwrap();
    assert!(Arc::ptr_eq(&first, &validator(&session, "mcp_b")));
    // Another shape is its own validator, and it validates by its own schema.
    session
        .register(
            Probe::new("mcp_c")
                .schema(json!({"type": "object", "required": ["n"]}))
                .arc(),
        )
        .unwrap();
    assert!(!Arc::ptr_eq(&first, &validator(&session, "mcp_c")));
    assert!(session.prepare("mcp_c", &json!({})).is_err());
    assert!(session.prepare("mcp_b", &json!({"q": "x"})).is_ok());
    assert!(session.prepare("mcp_b", &json!({"q": 1})).is_err());
}

#[test]
fn a_validator_no_tool_uses_is_not_kept() {
    let compiled = CompiledSchemas::default();
    let schema = json!({"type": "object", "description": "once"});
    let weak = Arc::downgrade(&compiled.compile(&schema).unwrap());
    assert!(weak.upgrade().is_none(), "dropped with its last user");
    let again = compiled.compile(&schema).unwrap();
    assert!(again.validate(&json!({})).is_ok());
    // Compiling another schema sweeps the dead entry away.
    let _other = compiled.compile(&json!({"type": "string"})).unwrap();
    drop(again);
    let _third = compiled.compile(&json!({"type": "number"})).unwrap();
    assert_eq!(compiled.len(), 2);
}

/// Wraps a probe so its description is its (generated) name.
struct Listing {
    probe: Probe,
    meta: ToolMeta,
}

impl Listing {
    /// The deferral tool for `deferred`. The registry keys it by the configured name; the
    /// probe's own name carries the list.
    fn of(deferred: &[&str]) -> Self {
        let mut probe = Probe::new("activate_tools");
        probe.meta.name = format!("activate_tools[{}]", deferred.join(","));
        let meta = ToolMeta::new(
            "activate_tools",
            &probe.meta.name,
            json!({"type": "object"}),
            Effects::NONE,
        );
        Self { probe, meta }
    }
}

#[async_trait]
impl Tool for Listing {
    fn meta(&self) -> &ToolMeta {
        &self.meta
    }
    async fn call(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        self.probe.call(ctx, args).await
    }
}

/// An entry for a probe tool called `name`, as the registry would make it.
pub(super) fn probe_entry(name: &str) -> Entry {
    let tool: Arc<dyn Tool> = Probe::new(name).arc();
    Entry {
        validator: Arc::new(ArgsValidator::compile(tool.input_schema()).unwrap()),
        tool,
    }
}
