//! The queue suite on PostgreSQL: one server started by the test kit, a fresh database per test;
//! then what only a server can do to a queue: end its connection, stop answering.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::queue::{open_queue, NewTask, QueueBackend};
use leasehold_testkit::servers::{shared_postgres, PostgresServer};
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
    server.signal_all(libc::SIGSTOP);
    let started = Instant::now();
    let err = q
        .enqueue(&NewTask::new("k", "b"))
        .await
        .expect_err("no answer");
    let took = started.elapsed();
    server.signal_all(libc::SIGCONT);
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
