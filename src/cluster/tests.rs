//! Leases and the fenced writer on PostgreSQL (`AGENTD_TEST_POSTGRES_URL`), each test in a
//! schema of its own that is dropped afterwards.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use serde_json::{Value, json};
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::fenced::{EVENTS_CHANNEL, FencedWriter};
use super::lease::{self, Lease};
use crate::store::postgres::PostgresStore;
use crate::store::tests::TestSchema;
use crate::store::{NewEvent, NewSession, Store, StoreError, Write};

/// Runs `case` on a fresh schema: the store, and a pool of the cluster's own on it.
async fn on_postgres<F, Fut>(case: F)
where
    F: FnOnce(Arc<dyn Store>, PgPool) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some(schema) = TestSchema::create().await else {
        return;
    };
    let options = schema.options();
    let store: Arc<dyn Store> = Arc::new(
        PostgresStore::connect_with(options.clone())
            .await
            .expect("open the store"),
    );
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .expect("cluster pool");
    let case = case(Arc::clone(&store), pool.clone());
    let closing = pool.clone();
    schema
        .run(
            async move {
                case.await;
                closing.close().await;
            },
            store,
        )
        .await;
}

async fn create(store: &dyn Store, id: &str) {
    store
        .create_session(&NewSession {
            session_id: id.to_owned(),
            user_name: None,
            cwd: "project".to_owned(),
            title: None,
            parent_session_id: None,
            agent: None,
        })
        .await
        .expect("create");
}

fn message(text: &str) -> Write {
    Write::Message {
        session_id: "s1".into(),
        message: json!({"role": "user", "content": text}),
        event_seq: 0,
    }
}

#[tokio::test]
async fn a_lease_has_one_owner_and_fences_a_late_writer() {
    on_postgres(|store, pool| async move {
        create(&*store, "s1").await;
        let minute = Duration::from_secs(60);
        let a = lease::acquire(&pool, "s1", "node-a", minute)
            .await
            .expect("acquire")
            .expect("a free lease is taken");
        assert_eq!((a.node_id.as_str(), a.epoch), ("node-a", 1));
        assert!(a.expires_at > OffsetDateTime::now_utc());
        assert_eq!(
            lease::acquire(&pool, "s1", "node-b", minute).await.unwrap(),
            None
        );
        assert_eq!(
            lease::acquire(&pool, "s1", "node-a", minute).await.unwrap(),
            None,
            "a held lease is renewed, not taken again"
        );
        let a = lease::renew(&pool, &a, minute)
            .await
            .unwrap()
            .expect("renewed");
        let lost_a = CancellationToken::new();
        let refused = Counter::<u64>::default();
        let writer_a = FencedWriter::for_lease(pool.clone(), &a, lost_a.clone(), refused.clone());
        writer_a
            .write_all(&[message("by a")])
            .await
            .expect("the owner writes");

        // A lapses (a renewal of no time stands for a node that stopped renewing); B takes over.
        lease::renew(&pool, &a, Duration::ZERO)
            .await
            .unwrap()
            .expect("still a's");
        let b = lease::acquire(&pool, "s1", "node-b", minute)
            .await
            .unwrap()
            .expect("a lapsed lease is taken over");
        assert_eq!((b.node_id.as_str(), b.epoch), ("node-b", 2));
        // The old owner, back from a pause, can neither renew nor write; its actor is told.
        assert_eq!(lease::renew(&pool, &a, minute).await.unwrap(), None);
        assert!(!lease::release(&pool, &a).await.unwrap());
        assert!(!lost_a.is_cancelled());
        let err = writer_a
            .write_all(&[message("late by a"), message("later by a")])
            .await
            .expect_err("fenced");
        assert!(
            matches!(err, StoreError::Fenced { epoch: 1, .. }),
            "{err:?}"
        );
        assert!(lost_a.is_cancelled(), "the refused actor is stopped");
        assert_eq!(refused.get(), 1);
        let writer_b = FencedWriter::for_lease(
            pool.clone(),
            &b,
            CancellationToken::new(),
            Counter::default(),
        );
        writer_b
            .write_all(&[message("by b")])
            .await
            .expect("the new owner writes");
        let texts: Vec<Value> = store
            .messages("s1")
            .await
            .unwrap()
            .into_iter()
            .map(|m| m["content"].clone())
            .collect();
        assert_eq!(
            texts,
            [json!("by a"), json!("by b")],
            "nothing of the late batch landed"
        );

        // A release lapses the lease and keeps its epoch, so the next owner's is higher.
        assert!(lease::release(&pool, &b).await.unwrap());
        let lapsed = lease::current(&pool, "s1").await.unwrap().expect("kept");
        assert_eq!(lapsed.epoch, 2);
        assert!(lapsed.released());
        let again = lease::acquire(&pool, "s1", "node-a", minute)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(again.epoch, 3);

        // No lease, no fenced write; a lease needs its session, and goes with it.
        create(&*store, "s2").await;
        let unleased = Lease {
            session_id: "s2".into(),
            node_id: "node-a".into(),
            epoch: 1,
            expires_at: OffsetDateTime::now_utc(),
        };
        let err = FencedWriter::for_lease(
            pool.clone(),
            &unleased,
            CancellationToken::new(),
            Counter::default(),
        )
        .mark_no_open_work("s2", 0)
        .await
        .expect_err("no lease");
        assert!(matches!(err, StoreError::Fenced { .. }), "{err:?}");
        let err = lease::acquire(&pool, "missing", "node-a", minute)
            .await
            .expect_err("no session");
        assert!(matches!(err, StoreError::NotFound(_)), "{err:?}");
        assert!(store.delete_session("s1").await.unwrap());
        assert_eq!(lease::current(&pool, "s1").await.unwrap(), None);
    })
    .await;
}

#[tokio::test]
async fn racing_nodes_take_a_lapsed_lease_once() {
    on_postgres(|store, pool| async move {
        create(&*store, "s1").await;
        let first = lease::acquire(&pool, "s1", "node-0", Duration::ZERO)
            .await
            .unwrap()
            .expect("taken");
        assert_eq!(first.epoch, 1);
        let races = (1..=8).map(|n| {
            let pool = pool.clone();
            tokio::spawn(async move {
                lease::acquire(&pool, "s1", &format!("node-{n}"), Duration::from_secs(60))
                    .await
                    .unwrap()
            })
        });
        let won: Vec<Lease> = futures_util::future::join_all(races)
            .await
            .into_iter()
            .filter_map(|joined| joined.unwrap())
            .collect();
        assert_eq!(won.len(), 1, "{won:?}");
        assert_eq!(won[0].epoch, 2);
        assert_eq!(
            lease::current(&pool, "s1").await.unwrap().as_ref(),
            Some(&won[0])
        );
    })
    .await;
}

#[tokio::test]
async fn fenced_events_are_announced_at_commit_with_their_last_seq() {
    on_postgres(|store, pool| async move {
        create(&*store, "s1").await;
        let held = lease::acquire(&pool, "s1", "node-a", Duration::from_secs(60))
            .await
            .unwrap()
            .expect("taken");
        let mut listener = PgListener::connect_with(&pool).await.expect("listener");
        listener.listen(EVENTS_CHANNEL).await.expect("listen");
        let writer = FencedWriter::for_lease(
            pool.clone(),
            &held,
            CancellationToken::new(),
            Counter::default(),
        );
        let events: Vec<NewEvent> = (1..=3)
            .map(|seq| NewEvent::now(Arc::from("s1"), seq, "item/completed", &json!({"n": seq})))
            .collect();
        writer
            .write_all(&[message("first"), Write::Events(events)])
            .await
            .expect("write");
        let notice = tokio::time::timeout(Duration::from_secs(10), listener.recv())
            .await
            .expect("a notice comes")
            .expect("notice");
        let payload: Vec<&str> = notice.payload().split(' ').collect();
        assert_eq!(&payload[..2], ["s1", "3"], "{payload:?}");
        assert_eq!(store.events_after("s1", 0, 10).await.unwrap().len(), 3);
        // A write without events says nothing.
        writer.write_all(&[message("second")]).await.expect("write");
        writer
            .append_events(&[NewEvent::now(
                Arc::from("s1"),
                4,
                "item/completed",
                &json!({}),
            )])
            .await
            .expect("write");
        let notice = tokio::time::timeout(Duration::from_secs(10), listener.recv())
            .await
            .expect("a notice comes")
            .expect("notice");
        assert!(
            notice.payload().starts_with("s1 4 "),
            "{}",
            notice.payload()
        );
    })
    .await;
}
