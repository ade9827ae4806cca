use super::*;

fn mode_of(p: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.permissions().mode() & 0o777)
        .unwrap_or(0)
}

/// The queue holds command lines: a new one, its WAL and shared-memory files and the
/// directories made for it are the owner's only, whatever the umask (the test runs under the
/// usual 022), unless the URL's `mode` shares them.
#[tokio::test]
async fn a_new_queue_is_readable_by_its_owner_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state/leasehold/queue.db");
    let q = SqliteQueue::from_url(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let task = NewTask::new("alice", "echo secret-token");
    q.enqueue(&task).await.unwrap();
    for file in ["queue.db", "queue.db-wal", "queue.db-shm"] {
        assert_eq!(mode_of(&path.with_file_name(file)), 0o600, "{file}");
    }
    assert_eq!(mode_of(&dir.path().join("state")), 0o700);
    assert_eq!(mode_of(&dir.path().join("state/leasehold")), 0o700);

    let shared = dir.path().join("shared/queue.db");
    let q = SqliteQueue::from_url(&format!("sqlite://{}?mode=0640", shared.display()))
        .await
        .unwrap();
    q.enqueue(&task).await.unwrap();
    assert_eq!(mode_of(&shared), 0o640);
    assert_eq!(mode_of(&shared.with_file_name("queue.db-wal")), 0o640);
    assert_eq!(mode_of(&dir.path().join("shared")), 0o750);

    for bad in ["?mode=0200", "?mode=rw", "?colour=red"] {
        let url = format!("sqlite://{}{bad}", dir.path().join("x.db").display());
        assert!(
            matches!(
                SqliteQueue::from_url(&url).await,
                Err(Error::InvalidUrl { .. })
            ),
            "{bad}"
        );
    }
}

/// A queue opened and read while another connection holds the write lock (a worker stopped
/// mid-transaction): nothing waits for the lock.
#[tokio::test]
async fn a_reader_opens_the_queue_while_a_writer_holds_its_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("queue.db");
    SqliteQueue::open(&path).await.unwrap();
    let writer = Connection::open(&path).unwrap();
    writer.execute_batch("BEGIN IMMEDIATE").unwrap();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let q = SqliteQueue::open(&path).await?;
        q.status().await
    })
    .await;
    assert!(
        matches!(read, Ok(Ok(_))),
        "{:?}",
        read.map(|r| r.map(|_| ()))
    );
    writer.execute_batch("ROLLBACK").unwrap();
}
