//! The queue suite on PostgreSQL: one server started by the test kit, a fresh database per test;
//! then what only a server can do to a queue: end its connection, stop answering.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::queue::{open_queue, NewTask, QueueBackend};
use leasehold_testkit::servers::{shared_postgres, Pausable, PostgresServer};
use std::sync::Arc;
use std::time::{Duration, Instant};

leasehold_testkit::queue_tests!(leasehold_testkit::servers::shared_postgres().fresh_db());

async fn open(url: &str) -> Arc<dyn QueueBackend> {
    open_queue(url).await.unwrap()
}

/// The database of a queue URL (`postgres://…/DB[?…]`).
fn db_of(url: &str) -> &str {
    let path = url.rsplit('/').next().unwrap_or_default();
    path.split('?').next().unwrap_or_default()
}

/// The number of pending tasks.
async fn pending(q: &Arc<dyn QueueBackend>) -> u64 {
    let s = q.status().await.unwrap();
    s.pending.high + s.pending.normal + s.pending.low
}

/// The server ends the queue's connection (an administrator's `pg_terminate_backend`, a
/// restart, a proxy's idle timeout): the queue connects again. At most the first call after it
/// fails, retryably; nothing is lost.
#[tokio::test]
async fn a_connection_the_server_ended_is_made_again() {
    let server = shared_postgres();
    let url = server.fresh_db();
    let q = open(&url).await;
    q.enqueue(&NewTask::new("k", "a")).await.unwrap();
    let ended = server.psql(
        db_of(&url),
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    );
    assert_eq!(ended.as_deref(), Some("1"), "the queue's one connection");
    if let Err(e) = q.enqueue(&NewTask::new("k", "b")).await {
        assert!(e.is_retryable(), "{e}");
        q.enqueue(&NewTask::new("k", "b")).await.unwrap();
    }
    q.enqueue(&NewTask::new("k", "c")).await.unwrap();
    assert_eq!(pending(&q).await, 3);
}

/// A server that stops answering (every process of it stopped, as on a host that hangs): a call
/// fails within the queue's `?timeout=`, retryably, and leaves nothing half done; once the server
/// answers again, the next call connects anew and goes through.
#[tokio::test]
async fn a_server_that_stops_answering_fails_calls_within_the_timeout() {
    let server = PostgresServer::start();
    let url = format!("{}?timeout=1s", server.fresh_db());
    let q = open(&url).await;
    q.enqueue(&NewTask::new("k", "a")).await.unwrap();
    server.pause();
    let started = Instant::now();
    let err = q
        .enqueue(&NewTask::new("k", "b"))
        .await
        .expect_err("no answer");
    let took = started.elapsed();
    server.resume();
    assert!(err.is_retryable(), "{err}");
    assert!(took < Duration::from_secs(3), "{took:?}: {err}");
    q.enqueue(&NewTask::new("k", "c")).await.unwrap();
    assert_eq!(pending(&q).await, 2, "a and c; b was never committed");
}

/// `?timeout=` takes a duration; anything else is refused as a bad URL, before connecting.
#[tokio::test]
async fn a_bad_timeout_is_a_bad_url() {
    let url = shared_postgres().fresh_db();
    for bad in ["nope", "0s", ""] {
        match open_queue(&format!("{url}?timeout={bad}")).await {
            Err(leasehold::Error::InvalidUrl { reason, .. }) => {
                assert!(reason.contains("timeout"), "{reason}");
            }
            other => panic!("timeout={bad}: {:?}", other.map(|_| ())),
        }
    }
    // With the driver's own parameters beside it.
    open(&format!("{url}?connect_timeout=5&timeout=2s")).await;
}

/// The race `cleanup` must not lose: a task being added for a key whose ended tasks it deletes.
/// The enqueue is held, after it wrote the key's row and before its commit, by another
/// transaction's uncommitted row of the task's group; `cleanup` then waits for it (the key
/// table's lock), instead of deleting the key's row from under the new task, which no claim
/// would then find.
#[tokio::test]
async fn cleanup_waits_for_an_enqueue_in_flight_on_a_key_it_empties() {
    let server = shared_postgres();
    let url = server.fresh_db();
    let q = open(&url).await;
    q.enqueue(&NewTask::new("k", "first")).await.unwrap();
    let req = leasehold_testkit::queue_suite::claim_req("w", 4);
    let first = q.claim(&req).await.unwrap().unwrap();
    assert!(q
        .finish(first.id, "w", &leasehold::queue::Outcome::Succeeded)
        .await
        .unwrap());

    let (holder, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    holder
        .batch_execute("BEGIN; INSERT INTO queue_groups (grp) VALUES ('g')")
        .await
        .unwrap();
    let enqueue = {
        let q = open(&url).await;
        tokio::spawn(async move {
            let mut t = NewTask::new("k", "second");
            t.group = Some("g".into());
            q.enqueue(&t).await.unwrap().id
        })
    };
    let waiting = || {
        server
            .psql(
                db_of(&url),
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while waiting() < 1 {
        assert!(Instant::now() < deadline, "the enqueue never waited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cleanup = {
        let q = open(&url).await;
        tokio::spawn(async move { q.cleanup(Duration::ZERO).await.unwrap() })
    };
    // The cleanup either waits for the enqueue (two waiters) or, wrongly, is done already.
    while waiting() < 2 && !cleanup.is_finished() {
        assert!(
            Instant::now() < deadline,
            "the cleanup neither waited nor ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    holder.batch_execute("ROLLBACK").await.unwrap();
    let second = enqueue.await.unwrap();
    assert_eq!(cleanup.await.unwrap(), 1, "the first task");
    let claimed = q.claim(&req).await.unwrap();
    assert_eq!(
        claimed.map(|t| t.id),
        Some(second),
        "the new task is claimable"
    );
}
