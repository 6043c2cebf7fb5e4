//! The store suite: every case is written once against `Arc<dyn Store>` and runs on a fresh
//! SQLite file and on PostgreSQL (`AGENTD_TEST_POSTGRES_URL`), each Postgres test in its own
//! schema that is dropped afterwards.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::{Connection, Executor};
use time::OffsetDateTime;

use super::postgres::{PostgresStore, parse_url};
use super::{
    CostRow, NewEvent, NewSession, SessionPage, SessionRow, Store, StoreError, TaskRow, TaskState,
    connect, timestamp_now, truncate_to_micros,
};

const POSTGRES_URL_VAR: &str = "AGENTD_TEST_POSTGRES_URL";

/// How a case opens its database again, to test reconnecting.
#[derive(Clone)]
enum Reopen {
    Sqlite(String),
    Postgres { url: String, schema: String },
}

impl Reopen {
    async fn open(&self) -> Arc<dyn Store> {
        match self {
            Reopen::Sqlite(url) => connect(url).await.expect("reopen sqlite"),
            Reopen::Postgres { url, schema } => {
                let options = parse_url(url)
                    .expect("postgres url")
                    .options([("search_path", schema.as_str())]);
                Arc::new(
                    PostgresStore::connect_with(options)
                        .await
                        .expect("reopen postgres"),
                )
            }
        }
    }
}

async fn run_on_sqlite<F, Fut>(case: F)
where
    F: FnOnce(Arc<dyn Store>, Reopen) -> Fut,
    Fut: Future<Output = ()>,
{
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/agentd.db", dir.path().display());
    let reopen = Reopen::Sqlite(url);
    let store = reopen.open().await;
    case(store.clone(), reopen).await;
    store.close().await;
}

/// A schema of its own on the test PostgreSQL (`AGENTD_TEST_POSTGRES_URL`), for one test.
pub(crate) struct TestSchema {
    admin: sqlx::PgConnection,
    url: String,
    name: String,
}

impl TestSchema {
    /// A new, empty schema; `None` (the test skips) when the variable is unset.
    pub(crate) async fn create() -> Option<Self> {
        let Ok(url) = std::env::var(POSTGRES_URL_VAR) else {
            println!("skipped: {POSTGRES_URL_VAR} is not set");
            return None;
        };
        let name = format!("t_{}", uuid::Uuid::new_v4().simple());
        let mut admin = sqlx::PgConnection::connect(&url)
            .await
            .expect("connect to the test postgres");
        admin
            .execute(format!("CREATE SCHEMA {name}").as_str())
            .await
            .expect("create schema");
        Some(Self { admin, url, name })
    }

    /// Connect options whose tables are the schema's.
    pub(crate) fn options(&self) -> sqlx::postgres::PgConnectOptions {
        parse_url(&self.url)
            .expect("postgres url")
            .options([("search_path", self.name.as_str())])
    }

    /// Runs `case` on its own task, so that a failing assertion still lets the schema be
    /// dropped, then drops it and passes the failure on.
    pub(crate) async fn run<Fut>(mut self, case: Fut, store: Arc<dyn Store>)
    where
        Fut: Future<Output = ()> + Send + 'static,
    {
        let outcome = tokio::spawn(case).await;
        store.close().await;
        self.admin
            .execute(format!("DROP SCHEMA {} CASCADE", self.name).as_str())
            .await
            .expect("drop schema");
        if let Err(err) = outcome {
            match err.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                Err(err) => panic!("case did not finish: {err}"),
            }
        }
    }
}

async fn run_on_postgres<F, Fut>(case: F)
where
    F: FnOnce(Arc<dyn Store>, Reopen) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some(schema) = TestSchema::create().await else {
        return;
    };
    let reopen = Reopen::Postgres {
        url: schema.url.clone(),
        schema: schema.name.clone(),
    };
    let store = reopen.open().await;
    schema.run(case(store.clone(), reopen), store).await;
}

macro_rules! store_cases {
    ($($case:ident),* $(,)?) => {
        mod on_sqlite {
            $(
                #[tokio::test]
                async fn $case() {
                    super::run_on_sqlite(super::$case).await;
                }
            )*
        }
        mod on_postgres {
            $(
                #[tokio::test]
                async fn $case() {
                    super::run_on_postgres(super::$case).await;
                }
            )*
        }
    };
}

store_cases!(
    reconnecting_reruns_migrations_harmlessly,
    data_survives_reconnecting,
    sessions_are_listed_per_user_newest_first,
    duplicate_session_id_is_conflict,
    deleting_a_session_cascades,
    set_session_title_changes_only_the_title,
    append_event_bumps_last_seq_and_rejects_stale_seq,
    events_after_returns_later_events_in_order_within_limit,
    messages_round_trip_in_order,
    tasks_are_inserted_updated_and_listed,
    fail_running_tasks_fails_only_running_ones,
    cost_rows_round_trip_in_order,
    json_round_trips_exactly,
    nul_characters_are_stored,
    concurrent_appends_to_many_sessions_all_land,
    a_batch_of_many_sessions_lands_in_order_or_not_at_all,
    group_commit_answers_each_write_of_a_failing_batch_alone,
    write_all_is_one_transaction,
    a_fork_copies_events_and_messages_up_to_the_cut,
);

fn new_session(id: &str, user: Option<&str>) -> NewSession {
    NewSession {
        session_id: id.to_owned(),
        user_name: user.map(str::to_owned),
        cwd: "project".to_owned(),
        title: None,
        parent_session_id: None,
        agent: None,
    }
}

fn task(task_id: &str, session_id: &str, state: TaskState, created_at: OffsetDateTime) -> TaskRow {
    TaskRow {
        task_id: task_id.to_owned(),
        session_id: session_id.to_owned(),
        tool_call_id: format!("call-{task_id}"),
        tool_name: "shell".to_owned(),
        state,
        exit_code: None,
        reason: None,
        total_bytes: 0,
        output_path: format!("/data/tasks/{task_id}.log"),
        created_at,
        finished_at: None,
    }
}

fn cost(session_id: &str, node_id: &str, created_at: OffsetDateTime) -> CostRow {
    CostRow {
        session_id: session_id.to_owned(),
        node_id: node_id.to_owned(),
        model: "gpt-test".to_owned(),
        reserved_usd: 0.25,
        actual_usd: 0.012_345_678_9,
        tokens_in: 1_234,
        tokens_out: 56,
        tokens_cached: 1_024,
        committed: true,
        turn_id: Some("turn-1".to_owned()),
        task_id: None,
        created_at,
    }
}

/// A timestamp `offset_ms` after a fixed instant, for rows whose order the test controls.
fn at(offset_ms: i64) -> OffsetDateTime {
    truncate_to_micros(
        OffsetDateTime::from_unix_timestamp(1_800_000_000).expect("valid instant")
            + time::Duration::milliseconds(offset_ms),
    )
}

fn ids(sessions: &[SessionRow]) -> Vec<&str> {
    sessions.iter().map(|s| s.session_id.as_str()).collect()
}

async fn reconnecting_reruns_migrations_harmlessly(store: Arc<dyn Store>, reopen: Reopen) {
    store
        .create_session(&new_session("s1", None))
        .await
        .expect("create");
    for _ in 0..2 {
        let again = reopen.open().await;
        again.ping().await.expect("ping after reconnect");
        assert_eq!(
            ids(&again
                .list_sessions(None, &SessionPage::all())
                .await
                .expect("list")),
            ["s1"]
        );
        again.close().await;
    }
    store.ping().await.expect("ping original");
}

async fn data_survives_reconnecting(store: Arc<dyn Store>, reopen: Reopen) {
    let session = store
        .create_session(&NewSession {
            title: Some("Persisted".to_owned()),
            ..new_session("s1", Some("alice"))
        })
        .await
        .expect("create");
    let event = store
        .append_event("s1", 1, "turn/started", &json!({"turn_id": "t1"}))
        .await
        .expect("append");
    store
        .append_message("s1", &json!({"role": "user", "content": "hi"}), 0)
        .await
        .expect("message");
    let task_row = task("task-1", "s1", TaskState::Completed, timestamp_now());
    store.upsert_task(&task_row).await.expect("task");
    let cost_row = cost("s1", "agent", timestamp_now());
    store.insert_cost_row(&cost_row).await.expect("cost");
    store.close().await;

    let reopened = reopen.open().await;
    let expected = SessionRow {
        last_seq: 1,
        updated_at: event.created_at,
        ..session
    };
    assert_eq!(
        reopened.get_session("s1").await.expect("get"),
        Some(expected)
    );
    assert_eq!(
        reopened.events_after("s1", 0, 10).await.expect("events"),
        vec![event]
    );
    assert_eq!(
        reopened.messages("s1").await.expect("messages"),
        vec![json!({"role": "user", "content": "hi"})]
    );
    assert_eq!(
        reopened.get_task("task-1").await.expect("task"),
        Some(task_row)
    );
    assert_eq!(
        reopened.cost_rows("s1").await.expect("costs"),
        vec![cost_row]
    );
    reopened.close().await;
}

async fn sessions_are_listed_per_user_newest_first(store: Arc<dyn Store>, _: Reopen) {
    let before = timestamp_now();
    let a1 = store
        .create_session(&new_session("a1", Some("alice")))
        .await
        .expect("a1");
    assert_eq!(a1.last_seq, 0);
    assert_eq!(a1.created_at, a1.updated_at);
    assert!(a1.created_at >= before);
    store
        .create_session(&new_session("a2", Some("alice")))
        .await
        .expect("a2");
    store
        .create_session(&new_session("b1", Some("bob")))
        .await
        .expect("b1");
    store
        .create_session(&new_session("n1", None))
        .await
        .expect("n1");
    store
        .upsert_user("alice")
        .await
        .expect("upsert existing user");
    store.upsert_user("carol").await.expect("upsert new user");

    assert_eq!(store.get_session("a1").await.expect("get"), Some(a1));
    assert_eq!(store.get_session("missing").await.expect("get"), None);

    assert_eq!(
        ids(&store
            .list_sessions(Some("alice"), &SessionPage::all())
            .await
            .expect("list")),
        ["a2", "a1"]
    );
    // An event makes the older session the most recently updated one.
    store
        .append_event("a1", 1, "turn/started", &json!({}))
        .await
        .expect("append");
    assert_eq!(
        ids(&store
            .list_sessions(Some("alice"), &SessionPage::all())
            .await
            .expect("list")),
        ["a1", "a2"]
    );
    assert_eq!(
        ids(&store
            .list_sessions(Some("bob"), &SessionPage::all())
            .await
            .expect("list")),
        ["b1"]
    );
    assert_eq!(
        ids(&store
            .list_sessions(None, &SessionPage::all())
            .await
            .expect("list")),
        ["n1"]
    );
    assert!(
        store
            .list_sessions(Some("carol"), &SessionPage::all())
            .await
            .expect("list")
            .is_empty()
    );
}

async fn duplicate_session_id_is_conflict(store: Arc<dyn Store>, _: Reopen) {
    store
        .create_session(&new_session("s1", None))
        .await
        .expect("create");
    let err = store
        .create_session(&new_session("s1", Some("alice")))
        .await
        .expect_err("duplicate");
    assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
    // The failed create left nothing behind, not even its user's sessions.
    assert!(
        store
            .list_sessions(Some("alice"), &SessionPage::all())
            .await
            .expect("list")
            .is_empty()
    );
}

async fn deleting_a_session_cascades(store: Arc<dyn Store>, _: Reopen) {
    for id in ["gone", "kept"] {
        store
            .create_session(&new_session(id, None))
            .await
            .expect("create");
        store
            .append_event(id, 1, "turn/started", &json!({"turn_id": "t"}))
            .await
            .expect("event");
        store
            .append_message(id, &json!({"role": "user"}), 0)
            .await
            .expect("message");
        store
            .upsert_task(&task(
                &format!("{id}-task"),
                id,
                TaskState::Running,
                timestamp_now(),
            ))
            .await
            .expect("task");
        store
            .insert_cost_row(&cost(id, "agent", timestamp_now()))
            .await
            .expect("cost");
    }

    assert!(store.delete_session("gone").await.expect("delete"));
    assert!(!store.delete_session("gone").await.expect("delete again"));

    assert_eq!(store.get_session("gone").await.expect("get"), None);
    assert!(
        store
            .events_after("gone", 0, 100)
            .await
            .expect("events")
            .is_empty()
    );
    assert!(store.messages("gone").await.expect("messages").is_empty());
    assert!(store.list_tasks("gone").await.expect("tasks").is_empty());
    assert_eq!(store.get_task("gone-task").await.expect("task"), None);
    assert!(store.cost_rows("gone").await.expect("costs").is_empty());
    // fail_running_tasks must not see the deleted session's running task.
    assert_eq!(store.fail_running_tasks("restart").await.expect("fail"), 1);

    assert_eq!(
        store
            .events_after("kept", 0, 100)
            .await
            .expect("events")
            .len(),
        1
    );
    assert_eq!(store.messages("kept").await.expect("messages").len(), 1);
    assert_eq!(store.list_tasks("kept").await.expect("tasks").len(), 1);
    assert_eq!(store.cost_rows("kept").await.expect("costs").len(), 1);
}

async fn set_session_title_changes_only_the_title(store: Arc<dyn Store>, _: Reopen) {
    let created = store
        .create_session(&new_session("s1", None))
        .await
        .expect("create");
    store
        .set_session_title("s1", "Fix the build — ünïcode")
        .await
        .expect("title");
    assert_eq!(
        store.get_session("s1").await.expect("get"),
        Some(SessionRow {
            title: Some("Fix the build — ünïcode".to_owned()),
            ..created
        })
    );
    store
        .set_session_model("s1", Some("an/claude-x"), Some("high"))
        .await
        .expect("model");
    let row = store.get_session("s1").await.expect("get").expect("row");
    assert_eq!(row.model.as_deref(), Some("an/claude-x"));
    assert_eq!(row.reasoning_effort.as_deref(), Some("high"));
    store
        .set_session_model("s1", None, None)
        .await
        .expect("back to the default");
    let row = store.get_session("s1").await.expect("get").expect("row");
    assert_eq!((row.model, row.reasoning_effort), (None, None));
    let worktree = crate::store::SessionWorktree {
        repo: "proj".into(),
        path: ".agentd-worktrees/s1".into(),
        branch: "agentd/s1".into(),
        base: "HEAD".into(),
        origin_cwd: "proj/src".into(),
    };
    store
        .set_session_worktree("s1", ".agentd-worktrees/s1/src", Some(&worktree))
        .await
        .expect("worktree");
    let row = store.get_session("s1").await.expect("get").expect("row");
    assert_eq!(
        (row.cwd.as_str(), row.worktree.as_ref()),
        (".agentd-worktrees/s1/src", Some(&worktree))
    );
    store
        .set_session_worktree("s1", "proj/src", None)
        .await
        .expect("worktree ended");
    let row = store.get_session("s1").await.expect("get").expect("row");
    assert_eq!((row.cwd.as_str(), row.worktree), ("proj/src", None));
    let err = store
        .set_session_title("missing", "x")
        .await
        .expect_err("missing session");
    assert!(matches!(err, StoreError::NotFound(_)), "{err:?}");
}

async fn append_event_bumps_last_seq_and_rejects_stale_seq(store: Arc<dyn Store>, _: Reopen) {
    let created = store
        .create_session(&new_session("s1", None))
        .await
        .expect("create");
    let first = store
        .append_event("s1", 1, "turn/started", &json!({"turn_id": "t1"}))
        .await
        .expect("seq 1");
    assert_eq!(
        (first.session_id.as_str(), first.seq, first.method.as_str()),
        ("s1", 1, "turn/started")
    );
    assert!(first.created_at >= created.created_at);
    let second = store
        .append_event("s1", 2, "message/delta", &json!({"text": "a"}))
        .await
        .expect("seq 2");

    let session = store.get_session("s1").await.expect("get").expect("exists");
    assert_eq!(session.last_seq, 2);
    assert_eq!(session.updated_at, second.created_at);

    for stale in [2, 1, 0] {
        let err = store
            .append_event("s1", stale, "message/delta", &json!({"text": "dup"}))
            .await
            .expect_err("stale seq");
        assert!(
            matches!(err, StoreError::Conflict(_)),
            "seq {stale}: {err:?}"
        );
    }
    let err = store
        .append_event("missing", 1, "turn/started", &json!({}))
        .await
        .expect_err("missing session");
    assert!(matches!(err, StoreError::NotFound(_)), "{err:?}");

    // Rejected appends stored nothing and left the counter alone.
    assert_eq!(
        store.events_after("s1", 0, 100).await.expect("events"),
        vec![first, second]
    );
    assert_eq!(
        store
            .get_session("s1")
            .await
            .expect("get")
            .expect("exists")
            .last_seq,
        2
    );
}

async fn events_after_returns_later_events_in_order_within_limit(store: Arc<dyn Store>, _: Reopen) {
    for id in ["s1", "other"] {
        store
            .create_session(&new_session(id, None))
            .await
            .expect("create");
    }
    for seq in 1..=10 {
        store
            .append_event("s1", seq, "message/delta", &json!({"n": seq}))
            .await
            .expect("append");
    }
    store
        .append_event("other", 1, "turn/started", &json!({}))
        .await
        .expect("append other");

    let seqs = |events: Vec<super::EventRow>| events.iter().map(|e| e.seq).collect::<Vec<_>>();
    assert_eq!(
        seqs(store.events_after("s1", 0, 100).await.expect("all")),
        (1..=10).collect::<Vec<_>>()
    );
    assert_eq!(
        seqs(store.events_after("s1", 4, 3).await.expect("page")),
        [5, 6, 7]
    );
    assert_eq!(
        seqs(store.events_after("s1", 9, 100).await.expect("tail")),
        [10]
    );
    assert!(
        store
            .events_after("s1", 10, 100)
            .await
            .expect("none")
            .is_empty()
    );
    assert!(
        store
            .events_after("s1", 0, 0)
            .await
            .expect("zero limit")
            .is_empty()
    );
    assert!(
        store
            .events_after("s1", 0, -1)
            .await
            .expect("negative limit")
            .is_empty()
    );
    let params: Vec<Value> = store
        .events_after("s1", 7, 100)
        .await
        .expect("params")
        .into_iter()
        .map(|e| e.params)
        .collect();
    assert_eq!(params, [json!({"n": 8}), json!({"n": 9}), json!({"n": 10})]);
}

async fn messages_round_trip_in_order(store: Arc<dyn Store>, _: Reopen) {
    for id in ["s1", "s2"] {
        store
            .create_session(&new_session(id, None))
            .await
            .expect("create");
    }
    let history = [
        json!({"role": "system", "content": "You are helpful."}),
        json!({"role": "user", "content": "list files"}),
        json!({"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "list_dir", "arguments": "{}"}}]}),
        json!({"role": "tool", "tool_call_id": "c1", "content": "a.txt\nb.txt"}),
    ];
    for (expected, message) in history.iter().enumerate() {
        let idx = store
            .append_message("s1", message, 0)
            .await
            .expect("append");
        assert_eq!(idx, i64::try_from(expected).expect("small index"));
    }
    assert_eq!(
        store
            .append_message("s2", &json!({"role": "user"}), 0)
            .await
            .expect("other session starts at 0"),
        0
    );
    assert_eq!(store.messages("s1").await.expect("messages"), history);
    assert!(store.messages("missing").await.expect("none").is_empty());
    let err = store
        .append_message("missing", &json!({}), 0)
        .await
        .expect_err("missing session");
    assert!(matches!(err, StoreError::NotFound(_)), "{err:?}");
}

async fn tasks_are_inserted_updated_and_listed(store: Arc<dyn Store>, _: Reopen) {
    for id in ["s1", "s2"] {
        store
            .create_session(&new_session(id, None))
            .await
            .expect("create");
    }
    let second = task("task-b", "s1", TaskState::Running, at(2_000));
    let first = task("task-a", "s1", TaskState::Running, at(1_000));
    let elsewhere = task("task-c", "s2", TaskState::Running, at(500));
    for row in [&second, &first, &elsewhere] {
        store.upsert_task(row).await.expect("insert");
    }
    assert_eq!(
        store.list_tasks("s1").await.expect("list"),
        vec![first.clone(), second.clone()]
    );
    assert_eq!(
        store.get_task("task-a").await.expect("get"),
        Some(first.clone())
    );
    assert_eq!(store.get_task("missing").await.expect("get"), None);

    let finished = TaskRow {
        state: TaskState::Completed,
        exit_code: Some(0),
        total_bytes: 4_096,
        finished_at: Some(at(3_500)),
        ..first.clone()
    };
    store.upsert_task(&finished).await.expect("update");
    let failed = TaskRow {
        state: TaskState::Failed,
        exit_code: Some(-9),
        reason: Some("killed by signal 9".to_owned()),
        total_bytes: 10,
        finished_at: Some(at(4_000)),
        ..second.clone()
    };
    store.upsert_task(&failed).await.expect("update");
    assert_eq!(
        store.list_tasks("s1").await.expect("list"),
        vec![finished, failed]
    );
    assert_eq!(store.list_tasks("s2").await.expect("list"), vec![elsewhere]);

    let err = store
        .upsert_task(&task("task-x", "missing", TaskState::Running, at(0)))
        .await
        .expect_err("missing session");
    assert!(matches!(err, StoreError::NotFound(_)), "{err:?}");
}

async fn fail_running_tasks_fails_only_running_ones(store: Arc<dyn Store>, _: Reopen) {
    store
        .create_session(&new_session("s1", None))
        .await
        .expect("create");
    let running = TaskRow {
        exit_code: None,
        total_bytes: 77,
        ..task("run-1", "s1", TaskState::Running, at(0))
    };
    let running_two = task("run-2", "s1", TaskState::Running, at(1));
    let completed = TaskRow {
        exit_code: Some(0),
        finished_at: Some(at(5)),
        ..task("done", "s1", TaskState::Completed, at(2))
    };
    let cancelled = TaskRow {
        reason: Some("cancelled by user".to_owned()),
        finished_at: Some(at(6)),
        ..task("stopped", "s1", TaskState::Cancelled, at(3))
    };
    for row in [&running, &running_two, &completed, &cancelled] {
        store.upsert_task(row).await.expect("insert");
    }

    let before = timestamp_now();
    let reason = "server restarted while the task was running";
    assert_eq!(store.fail_running_tasks(reason).await.expect("fail"), 2);
    for original in [&running, &running_two] {
        let now = store
            .get_task(&original.task_id)
            .await
            .expect("get")
            .expect("exists");
        let finished_at = now.finished_at.expect("finished_at set");
        assert!(finished_at >= before, "{finished_at} < {before}");
        assert_eq!(
            now,
            TaskRow {
                state: TaskState::Failed,
                exit_code: None,
                reason: Some(reason.to_owned()),
                finished_at: Some(finished_at),
                ..(*original).clone()
            }
        );
    }
    assert_eq!(store.get_task("done").await.expect("get"), Some(completed));
    assert_eq!(
        store.get_task("stopped").await.expect("get"),
        Some(cancelled)
    );
    assert_eq!(store.fail_running_tasks(reason).await.expect("again"), 0);
}

async fn cost_rows_round_trip_in_order(store: Arc<dyn Store>, _: Reopen) {
    for id in ["s1", "s2"] {
        store
            .create_session(&new_session(id, None))
            .await
            .expect("create");
    }
    let later = cost("s1", "agent", at(2_000));
    let earlier = CostRow {
        node_id: "pipeline:summarise".to_owned(),
        reserved_usd: 1.5,
        actual_usd: 0.0,
        tokens_in: 0,
        tokens_out: 0,
        tokens_cached: 0,
        committed: false,
        turn_id: None,
        task_id: Some("task-9".to_owned()),
        ..cost("s1", "x", at(1_000))
    };
    // Same timestamp as `later`: insertion order decides.
    let same_time = CostRow {
        node_id: "agent:helper".to_owned(),
        actual_usd: 1e-9,
        ..cost("s1", "x", at(2_000))
    };
    let other = cost("s2", "agent", at(0));
    for row in [&later, &earlier, &same_time, &other] {
        store.insert_cost_row(row).await.expect("insert");
    }
    assert_eq!(
        store.cost_rows("s1").await.expect("rows"),
        vec![earlier, later, same_time]
    );
    assert_eq!(store.cost_rows("s2").await.expect("rows"), vec![other]);
    let err = store
        .insert_cost_row(&cost("missing", "agent", at(0)))
        .await
        .expect_err("missing session");
    assert!(matches!(err, StoreError::NotFound(_)), "{err:?}");
}

async fn json_round_trips_exactly(store: Arc<dyn Store>, _: Reopen) {
    store
        .create_session(&new_session("s1", None))
        .await
        .expect("create");
    let params = json!({
        "nested": {"deep": {"deeper": [1, [2, [3, {"four": 4}]], {}]}, "empty_list": []},
        "unicode": "héllo wörld — 你好 — مرحبا — 🦀👩‍💻",
        "escapes": "quote \" backslash \\ newline \n tab \t bell \u{7} del \u{7f}",
        "numbers": {
            "zero": 0, "negative": -42, "i64_min": i64::MIN, "i64_max": i64::MAX,
            "u64_max": u64::MAX, "tenth": 0.1, "tiny": -2.5e-8, "huge": 1e300,
            "float_whole": 3.0, "pi": std::f64::consts::PI,
        },
        "literals": [true, false, null],
        "key with spaces and ünïcode 🔑": "v",
        "": "empty key",
    });
    let stored = store
        .append_event("s1", 1, "tool/completed", &params)
        .await
        .expect("append");
    assert_eq!(stored.params, params);
    let read = store.events_after("s1", 0, 1).await.expect("read");
    assert_eq!(read[0].params, params);
    // Scalars and arrays are valid top-level documents too.
    for message in [json!("just a string"), json!([1, "two", 3.5]), json!(null)] {
        store
            .append_message("s1", &message, 0)
            .await
            .expect("append");
    }
    assert_eq!(
        store.messages("s1").await.expect("messages"),
        [json!("just a string"), json!([1, "two", 3.5]), json!(null)]
    );
}

async fn nul_characters_are_stored(store: Arc<dyn Store>, _: Reopen) {
    store
        .create_session(&new_session("s1", None))
        .await
        .expect("create");
    let params = json!({"output": "bin\u{0}ary", "k\u{0}ey": ["\u{0}"]});
    store
        .append_event("s1", 1, "task/output/delta", &params)
        .await
        .expect("append with NUL");
    store
        .set_session_title("s1", "a\u{0}b")
        .await
        .expect("title with NUL");
    let (expected_params, expected_title) = match store.backend() {
        // PostgreSQL cannot hold NUL in TEXT or JSONB; it becomes U+FFFD.
        "postgres" => (
            json!({"output": "bin\u{FFFD}ary", "k\u{FFFD}ey": ["\u{FFFD}"]}),
            "a\u{FFFD}b",
        ),
        _ => (params, "a\u{0}b"),
    };
    let read = store.events_after("s1", 0, 1).await.expect("read");
    assert_eq!(read[0].params, expected_params);
    let session = store.get_session("s1").await.expect("get").expect("exists");
    assert_eq!(session.title.as_deref(), Some(expected_title));
}

async fn concurrent_appends_to_many_sessions_all_land(store: Arc<dyn Store>, _: Reopen) {
    const SESSIONS: usize = 8;
    const EVENTS: i64 = 20;
    let mut writers = tokio::task::JoinSet::new();
    for n in 0..SESSIONS {
        let store = store.clone();
        writers.spawn(async move {
            let id = format!("s{n}");
            store
                .create_session(&new_session(&id, None))
                .await
                .expect("create");
            for seq in 1..=EVENTS {
                store
                    .append_event(&id, seq, "message/delta", &json!({"seq": seq}))
                    .await
                    .expect("append");
                store
                    .append_message(&id, &json!({"seq": seq}), 0)
                    .await
                    .expect("message");
            }
        });
    }
    while let Some(done) = writers.join_next().await {
        done.expect("writer");
    }
    for n in 0..SESSIONS {
        let id = format!("s{n}");
        let session = store.get_session(&id).await.expect("get").expect("exists");
        assert_eq!(session.last_seq, EVENTS);
        assert_eq!(
            store
                .events_after(&id, 0, 1_000)
                .await
                .expect("events")
                .len(),
            usize::try_from(EVENTS).expect("small")
        );
        assert_eq!(
            store.messages(&id).await.expect("messages").len(),
            usize::try_from(EVENTS).expect("small")
        );
    }
}

fn event(session_id: &str, seq: i64) -> NewEvent {
    NewEvent::now(
        Arc::from(session_id),
        seq,
        "message/delta",
        &json!({"seq": seq, "of": session_id}),
    )
}

async fn create_sessions(store: &Arc<dyn Store>, ids: &[&str]) {
    for id in ids {
        store
            .create_session(&new_session(id, None))
            .await
            .expect("create");
    }
}

fn seqs_of(events: &[super::EventRow]) -> Vec<i64> {
    events.iter().map(|e| e.seq).collect()
}

async fn a_batch_of_many_sessions_lands_in_order_or_not_at_all(store: Arc<dyn Store>, _: Reopen) {
    create_sessions(&store, &["a", "b"]).await;
    // Interleaved sessions, several events of each: every seq checked against the one before.
    let batch = [
        event("a", 1),
        event("b", 1),
        event("a", 2),
        event("a", 3),
        event("b", 2),
    ];
    store.append_events(&batch).await.expect("batch");
    let a = store.events_after("a", 0, 100).await.expect("a");
    assert_eq!(seqs_of(&a), [1, 2, 3]);
    assert_eq!(a[2].params, json!({"seq": 3, "of": "a"}));
    let row = store.get_session("a").await.expect("get").expect("a");
    assert_eq!((row.last_seq, row.updated_at), (3, batch[3].created_at));
    assert_eq!(
        store
            .get_session("b")
            .await
            .expect("get")
            .expect("b")
            .last_seq,
        2
    );

    // A stale seq anywhere fails the whole batch, and nothing of it is stored.
    let stale = [event("b", 3), event("a", 3)];
    let err = store.append_events(&stale).await.expect_err("stale");
    assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
    // Out of order within one batch is stale too.
    let reordered = [event("a", 5), event("a", 4)];
    let err = store
        .append_events(&reordered)
        .await
        .expect_err("reordered");
    assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
    // A missing session fails it as well.
    let orphan = [event("b", 3), event("gone", 1)];
    let err = store.append_events(&orphan).await.expect_err("orphan");
    assert!(matches!(err, StoreError::NotFound(_)), "{err:?}");
    assert_eq!(
        seqs_of(&store.events_after("b", 0, 100).await.expect("b")),
        [1, 2]
    );
    assert_eq!(
        store
            .get_session("b")
            .await
            .expect("get")
            .expect("b")
            .last_seq,
        2
    );
    assert_eq!(
        seqs_of(&store.events_after("a", 0, 100).await.expect("a")),
        [1, 2, 3]
    );
}

async fn group_commit_answers_each_write_of_a_failing_batch_alone(
    store: Arc<dyn Store>,
    _: Reopen,
) {
    const SESSIONS: usize = 6;
    const EVENTS: i64 = 30;
    let batches = prometheus_client::metrics::counter::Counter::<u64>::default();
    let grouped = store.clone().group_commit(batches.clone());
    // SQLite's writing thread may take the first write before the rest are queued, so only
    // PostgreSQL's writers (tasks on this test's one thread) count exactly here; the thread's
    // batches are counted in `sqlite::writer`'s tests, which hold it busy.
    let counts_exactly = store.backend() == "postgres";
    let ids: Vec<String> = (0..SESSIONS).map(|n| format!("s{n}")).collect();
    create_sessions(&store, &ids.iter().map(String::as_str).collect::<Vec<_>>()).await;
    // Many sessions appending at once, each in order, while one appender sends only writes
    // that fail: the others' writes still land, and each failure is that write's own.
    let mut writers = tokio::task::JoinSet::new();
    for n in 0..SESSIONS {
        let grouped = grouped.clone();
        writers.spawn(async move {
            let id = format!("s{n}");
            for seq in 1..=EVENTS {
                grouped
                    .append_events(&[event(&id, seq)])
                    .await
                    .expect("append");
                let idx = grouped
                    .append_message(&id, &json!({"seq": seq}), 0)
                    .await
                    .expect("message");
                assert_eq!(idx, seq - 1);
            }
        });
    }
    let failing = {
        let grouped = grouped.clone();
        tokio::spawn(async move {
            let mut errors = Vec::new();
            for seq in 1..=EVENTS {
                errors.push(grouped.append_events(&[event("missing", seq)]).await);
                errors.push(
                    grouped
                        .insert_cost_row(&cost("missing", "agent", timestamp_now()))
                        .await,
                );
            }
            errors
        })
    };
    while let Some(done) = writers.join_next().await {
        done.expect("writer");
    }
    for outcome in failing.await.expect("failing appender") {
        assert!(
            matches!(outcome, Err(StoreError::NotFound(_))),
            "{outcome:?}"
        );
    }
    for n in 0..SESSIONS {
        let id = format!("s{n}");
        let events = store.events_after(&id, 0, 1_000).await.expect("events");
        assert_eq!(seqs_of(&events), (1..=EVENTS).collect::<Vec<_>>());
        assert_eq!(
            store
                .get_session(&id)
                .await
                .expect("get")
                .expect("s")
                .last_seq,
            EVENTS
        );
        let history = store.messages(&id).await.expect("messages");
        assert_eq!(history.len(), usize::try_from(EVENTS).expect("small"));
        assert_eq!(history[4], json!({"seq": 5}));
    }

    // Writes queued together (here: all before the writer first runs, on this test's one
    // thread) are one commit; a failing one among them costs a retry of each alone.
    let before = batches.get();
    let together: Vec<_> = (0..SESSIONS)
        .map(|n| {
            let grouped = grouped.clone();
            async move {
                let id = format!("s{n}");
                let new_event = [event(&id, EVENTS + 1)];
                let message = json!({"seq": EVENTS + 1});
                let cost_row = cost(&id, "agent", timestamp_now());
                let (events, idx, cost_row) = tokio::join!(
                    grouped.append_events(&new_event),
                    grouped.append_message(&id, &message, 0),
                    grouped.insert_cost_row(&cost_row),
                );
                events.expect("batched event");
                assert_eq!(idx.expect("batched message"), EVENTS);
                cost_row.expect("batched cost row");
            }
        })
        .collect();
    futures_util::future::join_all(together).await;
    if counts_exactly {
        assert_eq!(batches.get() - before, 1, "one commit for the batch");
    }
    for n in 0..SESSIONS {
        assert_eq!(
            store
                .cost_rows(&format!("s{n}"))
                .await
                .expect("costs")
                .len(),
            1
        );
    }
    let before = batches.get();
    let mixed = [
        event("s0", EVENTS + 2),
        event("missing", 1),
        event("s1", EVENTS + 2),
    ];
    let outcomes = futures_util::future::join_all(
        mixed
            .iter()
            .map(|e| grouped.append_events(std::slice::from_ref(e))),
    )
    .await;
    assert!(outcomes[0].is_ok() && outcomes[2].is_ok(), "{outcomes:?}");
    assert!(
        matches!(outcomes[1], Err(StoreError::NotFound(_))),
        "{outcomes:?}"
    );
    if counts_exactly {
        assert_eq!(batches.get() - before, 2, "the good two, each alone");
    }
    for id in ["s0", "s1"] {
        assert_eq!(
            store
                .get_session(id)
                .await
                .expect("get")
                .expect("s")
                .last_seq,
            EVENTS + 2
        );
    }
}

async fn write_all_is_one_transaction(store: Arc<dyn Store>, _: Reopen) {
    create_sessions(&store, &["s1"]).await;
    let writes = [
        super::Write::Message {
            session_id: "s1".into(),
            message: json!({"role": "user"}),
            event_seq: 0,
        },
        super::Write::Events(vec![event("s1", 1), event("s1", 2)]),
        super::Write::Message {
            session_id: "s1".into(),
            message: json!({"role": "assistant"}),
            event_seq: 0,
        },
        super::Write::Cost(cost("s1", "agent", timestamp_now())),
        super::Write::Task(task("t1", "s1", TaskState::Running, at(0))),
        super::Write::NoOpenWork {
            session_id: "s1".into(),
            last_seq: 2,
        },
    ];
    assert_eq!(
        store.write_all(&writes).await.expect("write_all"),
        [0, 0, 1, 0, 0, 0]
    );
    assert_eq!(store.messages("s1").await.expect("messages").len(), 2);
    assert_eq!(store.cost_rows("s1").await.expect("costs").len(), 1);
    assert_eq!(store.list_tasks("s1").await.expect("tasks").len(), 1);
    assert!(
        !store
            .sessions_with_open_work()
            .await
            .expect("open work")
            .iter()
            .any(|(id, _)| id == "s1"),
        "the mark of the same transaction's last event is cleared"
    );
    // A failing write undoes the ones before it in the same call.
    let failing = [
        super::Write::Message {
            session_id: "s1".into(),
            message: json!({"role": "user"}),
            event_seq: 0,
        },
        super::Write::Task(task("t2", "s1", TaskState::Running, at(1))),
        super::Write::Cost(cost("missing", "agent", timestamp_now())),
    ];
    let err = store
        .write_all(&failing)
        .await
        .expect_err("missing session");
    assert!(matches!(err, StoreError::NotFound(_)), "{err:?}");
    assert_eq!(store.messages("s1").await.expect("messages").len(), 2);
    assert_eq!(store.list_tasks("s1").await.expect("tasks").len(), 1);
    assert_eq!(
        store
            .get_session("s1")
            .await
            .expect("get")
            .expect("s1")
            .last_seq,
        2
    );
}

// Backend-independent behaviour.

#[tokio::test]
async fn urls_without_a_known_scheme_are_invalid() {
    for url in [
        "mysql://root@localhost/db",
        "agentd.db",
        "",
        "http://example.com/",
    ] {
        let err = connect(url)
            .await
            .err()
            .unwrap_or_else(|| panic!("{url:?} should fail"));
        assert!(matches!(err, StoreError::InvalidUrl(_)), "{url:?}: {err:?}");
    }
    let err = connect("postgres://user:secret@[bad-host/db")
        .await
        .err()
        .expect("unparsable postgres url");
    assert!(matches!(err, StoreError::InvalidUrl(_)), "{err:?}");
    assert!(!err.to_string().contains("secret"), "{err}");
}

#[tokio::test]
async fn unreachable_postgres_fails_quickly() {
    let started = Instant::now();
    let err = connect("postgres://root:secret@127.0.0.1:1/test")
        .await
        .err()
        .expect("nothing listens on port 1");
    assert!(matches!(err, StoreError::Connect(_)), "{err:?}");
    assert!(!err.to_string().contains("secret"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn sqlite_creates_missing_parent_directories() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("data").join("nested").join("agentd.db");
    let store = connect(&format!("sqlite://{}", file.display()))
        .await
        .expect("connect");
    store.ping().await.expect("ping");
    assert_eq!(store.backend(), "sqlite");
    store.close().await;
    assert!(file.is_file());

    // WAL is a property of the file, so a plain connection sees it.
    let mut raw = sqlx::SqliteConnection::connect(&format!("sqlite://{}", file.display()))
        .await
        .expect("raw connect");
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut raw)
        .await
        .expect("journal_mode");
    assert_eq!(mode, "wal");
    raw.close().await.expect("close raw");
}

#[tokio::test]
async fn sqlite_in_memory_database_is_shared_by_the_pool() {
    let store = connect("sqlite::memory:").await.expect("connect");
    // Concurrent calls use several pooled connections; all must see one database.
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..6 {
        let store = store.clone();
        tasks.spawn(async move {
            store
                .create_session(&new_session(&format!("m{n}"), None))
                .await
                .expect("create");
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("task");
    }
    assert_eq!(
        store
            .list_sessions(None, &SessionPage::all())
            .await
            .expect("list")
            .len(),
        6
    );
    store.close().await;
}

#[test]
fn rows_serialise_as_the_contract_shapes() {
    let task_row = TaskRow {
        exit_code: Some(1),
        ..task("task-1", "s1", TaskState::Failed, at(0))
    };
    assert_eq!(
        serde_json::to_value(&task_row).expect("task json"),
        json!({
            "task_id": "task-1", "session_id": "s1", "tool_call_id": "call-task-1",
            "tool_name": "shell", "state": "failed", "exit_code": 1, "reason": null,
            "total_bytes": 0, "created_at": "2027-01-15T08:00:00Z", "finished_at": null,
        })
    );
    let cost_row = CostRow {
        created_at: at(1_500),
        ..cost("s1", "agent", at(0))
    };
    assert_eq!(
        serde_json::to_value(&cost_row).expect("cost json"),
        json!({
            "session_id": "s1", "node_id": "agent", "model": "gpt-test", "reserved_usd": 0.25,
            "actual_usd": 0.012_345_678_9, "tokens_in": 1_234, "tokens_out": 56,
            "tokens_cached": 1_024, "committed": true, "turn_id": "turn-1", "task_id": null,
            "created_at": "2027-01-15T08:00:01.5Z",
        })
    );
    let session = SessionRow {
        session_id: "s1".to_owned(),
        user_name: None,
        title: Some("T".to_owned()),
        cwd: "project".to_owned(),
        created_at: at(0),
        updated_at: at(0) + time::Duration::microseconds(7),
        last_seq: 3,
        parent_session_id: Some("s0".to_owned()),
        agent: None,
        model: None,
        reasoning_effort: None,
        worktree: None,
    };
    assert_eq!(
        serde_json::to_value(&session).expect("session json"),
        json!({
            "session_id": "s1", "user_name": null, "title": "T", "cwd": "project",
            "created_at": "2027-01-15T08:00:00Z", "updated_at": "2027-01-15T08:00:00.000007Z",
            "last_seq": 3, "parent_session_id": "s0",
        })
    );
}

#[test]
fn timestamps_are_truncated_to_microseconds_in_utc() {
    let precise = OffsetDateTime::from_unix_timestamp_nanos(1_800_000_000_123_456_789)
        .expect("valid")
        .to_offset(time::macros::offset!(+2));
    let truncated = truncate_to_micros(precise);
    assert_eq!(truncated.offset(), time::UtcOffset::UTC);
    assert_eq!(truncated.unix_timestamp_nanos(), 1_800_000_000_123_456_000);
    assert_eq!(timestamp_now().nanosecond() % 1_000, 0);
}

async fn a_fork_copies_events_and_messages_up_to_the_cut(store: Arc<dyn Store>, _: Reopen) {
    store
        .create_session(&new_session("src", Some("alice")))
        .await
        .expect("create");
    for seq in 1..=4 {
        let params = json!({"session_id": "src", "seq": seq});
        store
            .append_event("src", seq, "message/delta", &params)
            .await
            .expect("event");
        store
            .append_message("src", &json!({"n": seq}), seq)
            .await
            .expect("message");
    }
    let fork = store
        .fork_session(
            &NewSession {
                parent_session_id: Some("src".into()),
                agent: None,
                ..new_session("fork", Some("alice"))
            },
            2,
        )
        .await
        .expect("fork");
    assert_eq!(fork.parent_session_id.as_deref(), Some("src"));
    assert_eq!(fork.last_seq, 2);
    let events = store.events_after("fork", 0, 10).await.expect("events");
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2]);
    assert!(
        events
            .iter()
            .all(|e| e.params["session_id"] == "fork" && e.session_id == "fork")
    );
    assert_eq!(events[1].params["seq"], 2);
    assert_eq!(
        store.messages("fork").await.expect("messages"),
        [json!({"n": 1}), json!({"n": 2})]
    );
    // The fork goes on from there; the source is untouched.
    store
        .append_message("fork", &json!({"n": "next"}), 2)
        .await
        .expect("append to the fork");
    assert_eq!(store.messages("src").await.expect("source").len(), 4);
    assert_eq!(
        store
            .get_session("src")
            .await
            .expect("get")
            .expect("source")
            .last_seq,
        4
    );
    // Deleting the source leaves the fork, without its parent.
    store.delete_session("src").await.expect("delete");
    let orphan = store.get_session("fork").await.expect("get").expect("fork");
    assert_eq!(orphan.parent_session_id, None);
}

/// Appends `count` events of about 4 KiB to session `s1`, starting after `from`.
async fn append_bulk(store: &dyn Store, from: i64, count: i64) {
    let sid: Arc<str> = Arc::from("s1");
    let filler = "x".repeat(4096);
    for seq in from + 1..=from + count {
        store
            .append_events(&[NewEvent::now(
                Arc::clone(&sid),
                seq,
                "tool/output/delta",
                &json!({"text": filler}),
            )])
            .await
            .expect("append");
    }
}

fn wal_size(dir: &std::path::Path) -> u64 {
    std::fs::metadata(dir.join("agentd.db-wal")).map_or(0, |m| m.len())
}

#[tokio::test]
async fn sqlite_keeps_its_wal_under_the_bound_while_readers_read_and_empties_it_at_close() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/agentd.db", dir.path().display());
    let bound: i64 = 256 * 1024;
    let store: Arc<dyn Store> = Arc::new(
        super::sqlite::SqliteStore::connect_with_wal_bound(&url, bound)
            .await
            .unwrap(),
    );
    store
        .create_session(&new_session("s1", None))
        .await
        .expect("create");
    // Readers that never stop keep some snapshot alive at every moment, which is what keeps a
    // passive checkpoint from ever rewinding the WAL.
    let reading = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (store, reading) = (Arc::clone(&store), Arc::clone(&reading));
            tokio::spawn(async move {
                while reading.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = store.events_after("s1", 0, 2).await;
                }
            })
        })
        .collect();
    // About 8 MiB of events, 32 times the bound.
    let mut written = 0;
    let mut largest = 0;
    let started = Instant::now();
    for _ in 0..8 {
        append_bulk(store.as_ref(), written, 250).await;
        written += 250;
        largest = largest.max(wal_size(dir.path()));
    }
    eprintln!(
        "2000 appends in {:?}, largest WAL {largest}",
        started.elapsed()
    );
    // The checkpointer runs every second: within a few, the WAL is back under the bound.
    let deadline = Instant::now() + Duration::from_secs(20);
    while wal_size(dir.path()) > bound as u64 {
        assert!(
            Instant::now() < deadline,
            "WAL still {} bytes (bound {bound}, largest {largest})",
            wal_size(dir.path())
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    reading.store(false, std::sync::atomic::Ordering::Relaxed);
    for reader in readers {
        reader.await.unwrap();
    }
    assert_eq!(
        store.events_after("s1", 0, 100_000).await.unwrap().len(),
        2000
    );
    store.close().await;
    assert_eq!(
        wal_size(dir.path()),
        0,
        "a closed store leaves no WAL behind"
    );
}
