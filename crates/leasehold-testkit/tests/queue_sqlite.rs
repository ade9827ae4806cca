//! The queue suite on SQLite: a fresh database file per test.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

fn fresh() -> String {
    let dir = tempfile::tempdir().expect("tempdir").keep();
    format!("sqlite://{}/queue.db", dir.display())
}

leasehold_testkit::queue_tests!(fresh());
