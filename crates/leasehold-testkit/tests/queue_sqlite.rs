//! The queue suite on SQLite: a fresh database file per test.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

fn fresh() -> String {
    let dir = tempfile::tempdir().expect("tempdir").keep();
    format!("sqlite://{}/queue.db", dir.display())
}

leasehold_testkit::queue_tests!(fresh());

/// A record damaged behind the queue's back is reported by `list` and `status`, marked failed by
/// dispatch, and the other tasks go on.
#[tokio::test]
async fn corrupt_records_are_reported_not_fatal() {
    use leasehold::queue::{ClaimRequest, NewTask, TaskEntry, TaskState};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("queue.db");
    let q = leasehold::queue::open_queue(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let bad_state = q.enqueue(&NewTask::new("a", "1")).await.unwrap().id;
    let bad_prio = q.enqueue(&NewTask::new("b", "2")).await.unwrap().id;
    let good = q.enqueue(&NewTask::new("c", "3")).await.unwrap().id;
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute(
            "UPDATE tasks SET state = 'exploded' WHERE id = ?1",
            [bad_state as i64],
        )
        .unwrap();
        c.execute(
            "UPDATE tasks SET priority = 'urgent', attempts = 'x' WHERE id = ?1",
            [bad_prio as i64],
        )
        .unwrap();
    }
    let all = q.list(true, 10).await.unwrap();
    assert!(
        matches!(&all[0], TaskEntry::Corrupt { id, corrupt } if *id == bad_state && corrupt.contains("exploded"))
    );
    assert!(matches!(&all[1], TaskEntry::Corrupt { id, .. } if *id == bad_prio));
    assert_eq!(q.status().await.unwrap().corrupt, 1, "the unknown state");
    let req = ClaimRequest {
        worker: "w".into(),
        max_running: 4,
        group_limit: None,
        ttl: std::time::Duration::from_secs(2),
    };
    let t = q.claim(&req).await.unwrap().unwrap();
    assert_eq!(t.id, good);
    assert!(q.claim(&req).await.unwrap().is_none());
    // Dispatch marked the corrupt pending record failed (it stays readable as corrupt).
    let c = rusqlite::Connection::open(&path).unwrap();
    let (state, detail): (String, String) = c
        .query_row(
            "SELECT state, detail FROM tasks WHERE id = ?1",
            [bad_prio as i64],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(state, "failed");
    assert!(detail.starts_with("corrupt record"), "{detail}");
    // The record of unknown state stays listed (as corrupt) among the active ones.
    let active = q.list(false, 10).await.unwrap();
    assert!(
        matches!(&active[..], [TaskEntry::Corrupt { id, .. }, TaskEntry::Task(t)] if *id == bad_state && t.id == good && t.state == TaskState::Running),
        "{active:?}"
    );
}

/// A queue waiting in `changed` wakes when another connection (another process, as far as it
/// knows: they share nothing but the file) adds a task, long before its bound; and when a
/// process outside leasehold writes the database (the `sqlite3` tool, here rusqlite).
#[tokio::test]
async fn changed_wakes_on_another_connection_s_commit() {
    use leasehold::queue::{open_queue, NewTask};
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("queue.db");
    let url = format!("sqlite://{}", path.display());
    let (waiter, adder) = (
        open_queue(&url).await.unwrap(),
        open_queue(&url).await.unwrap(),
    );
    // The first call makes the watch and returns at once.
    waiter.changed(Duration::from_secs(30)).await;
    // Nothing written: it waits (no polling timer ends it).
    assert!(
        tokio::time::timeout(
            Duration::from_millis(300),
            waiter.changed(Duration::from_secs(60))
        )
        .await
        .is_err(),
        "returned with nothing written"
    );
    for round in 0..2 {
        let wait = {
            let waiter = waiter.clone();
            tokio::spawn(async move { waiter.changed(Duration::from_secs(60)).await })
        };
        if round == 0 {
            adder.enqueue(&NewTask::new("k", "x")).await.unwrap();
        } else {
            let c = rusqlite::Connection::open(&path).unwrap();
            c.execute("UPDATE tasks SET payload = 'y'", []).unwrap();
        }
        tokio::time::timeout(Duration::from_secs(20), wait)
            .await
            .unwrap_or_else(|_| panic!("round {round}: not woken"))
            .unwrap();
    }
}
