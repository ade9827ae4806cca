//! The local layer's handoff, cancelled acquisitions, release notifications.

use super::fences::next_grant_is_above;
use super::waiters::Counting;
use super::*;

/// The local layer hands a lease from task to task of one process without a store call, each
/// with its own fence: tasks queued behind a holder get one store grant between them. While
/// another process contends for the key: never two holders at once, fences strictly increasing in
/// the order the holders entered, and the other process still gets its turns.
pub async fn local_handoff(store: Arc<dyn LockStore>) {
    let k = key("local-handoff");
    let counting = Arc::new(Counting {
        inner: store.clone(),
        acquires: AtomicU64::new(0),
    });
    let counted: Arc<dyn LockStore> = counting.clone();

    // Alone: a holder and three tasks queued behind it; the first goes to the store reserving
    // fences for the two behind it, who get them without a store call.
    let locks = Locks::from_arc(counted.clone()).with_holder(HolderId::new("alone"));
    let first = locks
        .lock_key(k.clone())
        .ttl(2000 * MS)
        .acquire()
        .await
        .expect("acquire");
    let queued: Vec<_> = (0..3)
        .map(|_| {
            let (locks, k) = (locks.clone(), k.clone());
            tokio::spawn(async move {
                let g = locks
                    .lock_key(k)
                    .ttl(2000 * MS)
                    .wait(20_000 * MS)
                    .acquire()
                    .await
                    .expect("acquire");
                let fence = g.fence();
                g.release().await.expect("release");
                fence
            })
        })
        .collect();
    while locks.queued(&k) < 3 {
        tokio::task::yield_now().await;
    }
    first.release().await.expect("release");
    let mut got = vec![];
    for t in queued {
        got.push(t.await.expect("task"));
    }
    got.sort_unstable();
    assert_eq!(
        counting.acquires.swap(0, Ordering::SeqCst),
        2,
        "4 leases queued on one key took more than 2 store grants (fences {got:?})"
    );
    assert!(
        got[1] == got[0] + 1 && got[2] == got[1] + 1,
        "handed-on fences {got:?} are not the consecutive fences of one block"
    );
    let inside = Arc::new(AtomicBool::new(false));
    let fences = Arc::new(std::sync::Mutex::new(Vec::<(u64, usize)>::new()));
    let (per_task, tasks_per_process) = (15, 4);
    let mut tasks = vec![];
    for (p, store) in [counted, store.clone()].into_iter().enumerate() {
        let locks = Locks::from_arc(store).with_holder(HolderId::new(format!("process-{p}")));
        for _ in 0..tasks_per_process {
            let (locks, k, inside, fences) =
                (locks.clone(), k.clone(), inside.clone(), fences.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..per_task {
                    let g = locks
                        .lock_key(k.clone())
                        .ttl(2000 * MS)
                        .wait(20_000 * MS)
                        .acquire()
                        .await
                        .expect("acquire");
                    assert!(
                        !inside.swap(true, Ordering::SeqCst),
                        "two holders inside at once"
                    );
                    fences.lock().expect("poisoned").push((g.fence(), p));
                    tokio::task::yield_now().await;
                    inside.store(false, Ordering::SeqCst);
                    assert_eq!(g.release().await.expect("release"), Released::Released);
                    assert_eq!(
                        g.release().await.expect("release"),
                        Released::AlreadyReleased
                    );
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("task");
    }
    let fences = fences.lock().expect("poisoned").clone();
    assert_eq!(fences.len(), 2 * tasks_per_process * per_task);
    for w in fences.windows(2) {
        assert!(
            w[1].0 > w[0].0,
            "fence {} (process {}) after {} (process {}) is not above it",
            w[1].0,
            w[1].1,
            w[0].0,
            w[0].1
        );
    }
    let store_acquires = counting.acquires.load(Ordering::SeqCst);
    assert!(
        store_acquires <= (tasks_per_process * per_task) as u64,
        "process 0 made {store_acquires} store grants for {} locks",
        tasks_per_process * per_task
    );
    let last = fences.last().map_or(0, |f| f.0);
    next_grant_is_above(&store, &k, last, "the last handed-on fence").await;
}

/// A lease handed on to a task that gives up before taking it is released in the store, not left
/// to expire.
pub async fn abandoned_handoff_is_released(store: Arc<dyn LockStore>) {
    let k = key("abandoned-handoff");
    let locks = Locks::from_arc(store.clone()).with_holder(HolderId::new("p"));
    let g = locks
        .lock_key(k.clone())
        .ttl(30_000 * MS)
        .try_acquire()
        .await
        .expect("a")
        .expect("free");
    let waiter = {
        let (locks, k) = (locks.clone(), k.clone());
        tokio::spawn(async move {
            locks
                .lock_key(k)
                .ttl(30_000 * MS)
                .wait(30_000 * MS)
                .acquire()
                .await
        })
    };
    // Let the waiter queue in the local layer (it waits there, not in the store).
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    drop(g);
    waiter.abort();
    // On a multi-thread runtime the waiter may take the handed-on lease before the abort lands; its
    // guard is then the task's output, which the handle keeps until awaited. Dropping it releases
    // the lease as well (without this the test failed about once in a hundred runs).
    drop(waiter.await);
    let other = client(&store, "other")
        .lock_key(k.clone())
        .ttl(2000 * MS)
        .wait(5000 * MS)
        .acquire()
        .await
        .expect("the abandoned lease was not released (it would only expire after 30 s)");
    other.release().await.expect("release");
}

/// An `acquire` or `try_acquire` dropped at any point (before, during or after its store call,
/// free key or held) leaves nothing taken: the lease it may have been granted is released and its
/// waiter registration withdrawn, so another holder gets the key at once, not after a TTL.
pub async fn cancelled_acquires_leave_nothing_taken(store: Arc<dyn LockStore>) {
    let k = key("cancelled-acquires");
    for round in 0..32u32 {
        // Odd rounds wait behind a holder (registered as waiter), even ones find the key free.
        let held = if round % 2 == 1 {
            Some(take(&store, "h", &k, "free (the last round released it)").await)
        } else {
            None
        };
        let l = client(&store, &format!("c{round}"));
        let k2 = k.clone();
        let task = tokio::spawn(async move {
            let b = l.lock_key(k2).ttl(30_000 * MS);
            if round % 4 == 0 {
                b.try_acquire().await.ok().flatten()
            } else {
                b.wait(30_000 * MS).acquire().await.ok()
            }
        });
        // Abort at a different point each round.
        for _ in 0..round * 4 {
            tokio::task::yield_now().await;
        }
        task.abort();
        // A guard the task returned before the abort landed is its output: dropping it releases.
        drop(task.await);
        if let Some(h) = held {
            h.release().await.expect("release");
        }
        let other = client(&store, "other")
            .lock_key(k.clone())
            .ttl(2000 * MS)
            .wait(4000 * MS)
            .acquire()
            .await
            .unwrap_or_else(|e| {
                panic!("round {round}: a cancelled acquisition left the key taken: {e}")
            });
        other.release().await.expect("release");
        // The given-up call may still be going on in the background (a store whose acquire
        // retries lost races, as the Kubernetes one does, can be granted the key after `other`
        // released it, and then releases it): the next round starts once that is done.
        crate::background::settle(5000 * MS).await;
    }
}

/// An observer that asked for a lease's release to be notified ([`LockStore::notify_release`],
/// what `leasehold watch` does) hears it through its subscription, though no contender waited;
/// asking about a lease the key does not hold (another fence) changes nothing and, on a store that
/// can tell, answers `false`.
pub async fn release_is_notified_when_asked(store: Arc<dyn LockStore>) {
    let k = key("notify");
    let g = take(&store, "h", &k, "free").await;
    assert!(
        store
            .notify_release(&k, Some(g.fence()))
            .await
            .expect("notify_release"),
        "the key holds the lease with that fence"
    );
    // Asking about another lease leaves this one as it is.
    let _ = store
        .notify_release(&k, Some(g.fence() + 1))
        .await
        .expect("notify_release");
    assert!(g.is_current());
    // Subscribed after the grant and the mark, so that the release is the change heard.
    let Some(mut changes) = store.subscribe(&k).await.expect("subscribe") else {
        // No notifications on this store: an observer polls, nothing to ask.
        return g.release().await.map(drop).expect("release");
    };
    g.release().await.expect("release");
    tokio::time::timeout(5000 * MS, changes.changed())
        .await
        .expect("the release was not notified to the subscriber within 5 s");
}
