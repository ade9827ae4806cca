//! Metrics count what happens, under a configurable prefix.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::{stores::memory::MemoryStore, HolderId, Locks, Metrics};
use std::time::Duration;

fn value(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in\n{text}"))
}

#[tokio::test]
async fn metrics_count_acquisitions_failures_renewals_losses_and_handoffs() {
    let registry = prometheus::Registry::new();
    let m = Metrics::register("app_locks", &registry).unwrap();
    let store = std::sync::Arc::new(MemoryStore::new());
    let a = Locks::from_arc(store.clone())
        .with_holder(HolderId::new("a"))
        .with_metrics(m.clone());
    let b = Locks::from_arc(store.clone())
        .with_holder(HolderId::new("b"))
        .with_metrics(m);

    let g = a
        .lock("k")
        .unwrap()
        .ttl(Duration::from_millis(300))
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    assert!(b.lock("k").unwrap().try_acquire().await.unwrap().is_none());
    let waiter = tokio::spawn({
        let b = b.clone();
        async move {
            b.lock("k")
                .unwrap()
                .ttl(Duration::from_millis(600))
                .wait(Duration::from_secs(5))
                .acquire()
                .await
        }
    });
    g.handoff_requested().await;
    g.release().await.unwrap();
    let gb = waiter.await.unwrap().unwrap();
    use leasehold::LockStore;
    store.force_release(gb.key()).await.unwrap();
    gb.lost().await;

    let text = Metrics::render(&registry);
    assert_eq!(value(&text, "app_locks_acquire_attempts_total"), 3.0);
    assert_eq!(value(&text, "app_locks_acquire_success_total"), 2.0);
    assert_eq!(
        value(
            &text,
            "app_locks_acquire_failures_total{reason=\"contention\"}"
        ),
        1.0
    );
    assert_eq!(value(&text, "app_locks_releases_total"), 1.0);
    assert!(value(&text, "app_locks_renewals_total") >= 1.0);
    assert_eq!(value(&text, "app_locks_lost_total"), 1.0);
    assert_eq!(value(&text, "app_locks_handoffs_requested_total"), 1.0);
    assert_eq!(value(&text, "app_locks_hold_duration_seconds_count"), 2.0);
    assert_eq!(
        value(&text, "app_locks_acquire_duration_seconds_count"),
        3.0
    );
}

#[tokio::test]
async fn local_handoffs_are_counted() {
    let registry = prometheus::Registry::new();
    let m = Metrics::register("app_locks", &registry).unwrap();
    let a = Locks::new(MemoryStore::new()).with_metrics(m);
    let g = a.lock("k").unwrap().try_acquire().await.unwrap().unwrap();
    // Two tasks queue in the local layer.
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let a = a.clone();
            tokio::spawn(async move {
                let g = a.lock("k").unwrap().acquire().await.unwrap();
                let f = g.fence();
                g.release().await.unwrap();
                f
            })
        })
        .collect();
    let key = leasehold::Key::new("k").unwrap();
    while a.queued(&key) < 2 {
        tokio::task::yield_now().await;
    }
    // The first waiter goes to the store reserving a fence for the second, then hands on.
    g.release().await.unwrap();
    let mut fences = vec![];
    for w in waiters {
        fences.push(w.await.unwrap());
    }
    assert_eq!(
        fences[1],
        fences[0] + 1,
        "the next fence of the reserved block"
    );
    let text = Metrics::render(&registry);
    assert_eq!(value(&text, "app_locks_local_handoffs_total"), 1.0);
    assert_eq!(value(&text, "app_locks_releases_total"), 3.0);
}

#[tokio::test]
async fn urls_are_checked() {
    for (url, want) in [
        ("nope://x", "unknown scheme"),
        ("not a url", "invalid store URL"),
        ("file://remote-host/x", "local directory"),
        ("file://u:secret@localhost/x?bad=1", "bad"),
    ] {
        let err = leasehold::open_store(url)
            .await
            .err()
            .unwrap_or_else(|| panic!("{url} accepted"));
        assert!(err.to_string().contains(want), "{url}: {err}");
        assert!(!err.to_string().contains("secret"), "{url}: {err}");
        assert!(
            matches!(err, leasehold::Error::InvalidUrl { .. }),
            "{url}: {err:?}"
        );
    }
    assert_eq!(
        leasehold::redact_url("redis://u:secret@h:1/0"),
        "redis://u:***@h:1/0"
    );
}
