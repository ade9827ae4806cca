//! The queue test suite: `pub async fn`s over a queue URL, run against every queue backend.
//!
//! Each function takes the URL of a fresh, empty queue (claims are queue-wide, so tests do not
//! share one) and opens it as often as it needs separate handles (separate connections, like
//! separate processes). [`queue_tests!`](crate::queue_tests) generates one test per function.

use leasehold::queue::{
    open_queue, CancelReason, Cancelled, ClaimRequest, NewTask, Outcome, Policy, Priority,
    QueueBackend, TaskEntry, TaskState,
};
use leasehold::Error;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Opens the queue at `url`.
pub async fn open(url: &str) -> Arc<dyn QueueBackend> {
    open_queue(url)
        .await
        .unwrap_or_else(|e| panic!("open queue {}: {e}", leasehold::redact_url(url)))
}

/// A claim by `worker` with `max_running` slots in all, no group limit, a 2 s claim TTL.
pub fn claim_req(worker: &str, max_running: u32) -> ClaimRequest {
    ClaimRequest {
        worker: worker.into(),
        max_running,
        group_limit: None,
        ttl: Duration::from_secs(2),
    }
}

fn task(key: &str, payload: &str) -> NewTask {
    NewTask::new(key, payload)
}

/// Polls `f` (each call a query, not a sleep on the condition itself) until it answers `Some`,
/// for at most 5 s.
async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn as_task(e: TaskEntry) -> leasehold::queue::Task {
    match e {
        TaskEntry::Task(t) => t,
        TaskEntry::Corrupt { id, corrupt } => panic!("task {id} corrupt: {corrupt}"),
    }
}

/// Positions count the tasks ahead in the key's line; inside a key tasks run in priority then
/// arrival order.
pub async fn priority_then_arrival_within_a_key(url: String) {
    let q = open(&url).await;
    let a = q.enqueue(&task("k", "n1")).await.unwrap();
    let b = q.enqueue(&task("k", "n2")).await.unwrap();
    let mut low = task("k", "l1");
    low.priority = Priority::Low;
    let c = q.enqueue(&low).await.unwrap();
    let mut high = task("k", "h1");
    high.priority = Priority::High;
    let d = q.enqueue(&high).await.unwrap();
    assert_eq!(
        (a.position, b.position, c.position, d.position),
        (1, 2, 3, 1)
    );
    assert!(a.id < b.id && b.id < c.id && c.id < d.id);
    let mut order = vec![];
    while let Some(t) = q.claim(&claim_req("w", 4)).await.unwrap() {
        assert_eq!(t.state, TaskState::Running);
        assert_eq!(t.attempts, 1);
        order.push(t.payload.clone());
        assert!(
            q.claim(&claim_req("w", 4)).await.unwrap().is_none(),
            "one per key"
        );
        assert!(q.finish(t.id, "w", &Outcome::Succeeded).await.unwrap());
    }
    assert_eq!(order, ["h1", "n1", "n2", "l1"]);
}

/// At most one running task per key, and never more than `max_running` in the whole queue.
pub async fn one_per_key_and_global_slots(url: String) {
    let q = open(&url).await;
    for k in 0..6 {
        for i in 0..3 {
            q.enqueue(&task(&format!("key{k}"), &format!("{i}")))
                .await
                .unwrap();
        }
    }
    let mut running = vec![];
    while let Some(t) = q.claim(&claim_req("w", 4)).await.unwrap() {
        running.push(t);
    }
    assert_eq!(running.len(), 4, "slots");
    let keys: HashSet<_> = running.iter().map(|t| t.key.clone()).collect();
    assert_eq!(keys.len(), 4, "one per key");
    let st = q.status().await.unwrap();
    assert_eq!(st.running, 4);
    assert_eq!(st.pending.normal, 14);
    assert_eq!(st.keys_total, 6);
    assert_eq!(st.leases.len(), 4);
    // A bigger capacity lets the two idle keys run, but no key twice.
    let more: Vec<_> = [
        q.claim(&claim_req("w", 8)).await.unwrap(),
        q.claim(&claim_req("w", 8)).await.unwrap(),
        q.claim(&claim_req("w", 8)).await.unwrap(),
    ]
    .into_iter()
    .flatten()
    .collect();
    assert_eq!(more.len(), 2);
    for t in &more {
        assert!(!keys.contains(&t.key));
    }
}

/// A key with one task enqueued behind a key with 100 starts within one round.
pub async fn fair_across_keys(url: String) {
    let q = open(&url).await;
    for i in 0..100 {
        q.enqueue(&task("busy", &format!("b{i}"))).await.unwrap();
    }
    q.enqueue(&task("quiet", "q")).await.unwrap();
    // One slot: the first round serves busy, the next one quiet.
    let first = q.claim(&claim_req("w", 1)).await.unwrap().unwrap();
    assert_eq!(first.key, "busy");
    q.finish(first.id, "w", &Outcome::Succeeded).await.unwrap();
    let second = q.claim(&claim_req("w", 1)).await.unwrap().unwrap();
    assert_eq!(
        second.key, "quiet",
        "the quiet key waited more than one round"
    );
    q.finish(second.id, "w", &Outcome::Succeeded).await.unwrap();
    // Round robin between busy keys too.
    for i in 0..3 {
        q.enqueue(&task("other", &format!("o{i}"))).await.unwrap();
    }
    let mut keys = vec![];
    for _ in 0..4 {
        let t = q.claim(&claim_req("w", 1)).await.unwrap().unwrap();
        keys.push(t.key.clone());
        q.finish(t.id, "w", &Outcome::Succeeded).await.unwrap();
    }
    assert_eq!(keys, ["other", "busy", "other", "busy"]);
}

/// The per-group limit holds back a group's other keys.
pub async fn group_limit(url: String) {
    let q = open(&url).await;
    for k in ["a", "b", "c"] {
        let mut t = task(k, k);
        t.group = Some("proj".into());
        q.enqueue(&t).await.unwrap();
    }
    q.enqueue(&task("solo", "s")).await.unwrap();
    let mut req = claim_req("w", 10);
    req.group_limit = Some(2);
    let mut got = vec![];
    while let Some(t) = q.claim(&req).await.unwrap() {
        got.push(t);
    }
    assert_eq!(got.len(), 3, "two of proj plus the groupless one");
    let st = q.status().await.unwrap();
    assert_eq!(st.groups.len(), 1);
    assert_eq!((st.groups[0].pending, st.groups[0].running), (1, 2));
}

/// A dead worker's task: at-most-once → failed, never run again; at-least-once → requeued until
/// its attempts are used up; the late worker's `finish` changes nothing.
pub async fn dead_worker_by_policy(url: String) {
    let q = open(&url).await;
    let once = q.enqueue(&task("a", "once")).await.unwrap();
    let mut t = task("b", "again");
    t.policy = Policy::AtLeastOnce { max_attempts: 2 };
    let again = q.enqueue(&t).await.unwrap();
    let mut req = claim_req("dead", 4);
    req.ttl = Duration::from_millis(100);
    assert!(q.claim(&req).await.unwrap().is_some());
    assert!(q.claim(&req).await.unwrap().is_some());
    // The two claims lapse a few ms apart: gather recovery passes until both are seen.
    let seen = Arc::new(std::sync::Mutex::new((Vec::new(), Vec::new())));
    eventually("the claims to lapse", || {
        let (q, seen) = (q.clone(), seen.clone());
        async move {
            let r = q.recover(Duration::from_secs(60)).await.unwrap();
            let mut s = seen.lock().unwrap();
            s.0.extend(r.failed);
            s.1.extend(r.requeued);
            (s.0.len() + s.1.len() >= 2).then_some(())
        }
    })
    .await;
    let (failed, requeued) = seen.lock().unwrap().clone();
    assert_eq!(failed, [once.id]);
    assert_eq!(requeued, [again.id]);
    let failed = as_task(q.get(once.id).await.unwrap());
    assert_eq!(failed.state, TaskState::Failed);
    assert!(failed.detail.unwrap().contains("at-most-once"));
    assert!(!q
        .finish(once.id, "dead", &Outcome::Succeeded)
        .await
        .unwrap());
    // The second attempt, lost too: attempts used up.
    let t2 = q.claim(&req).await.unwrap().unwrap();
    assert_eq!((t2.id, t2.attempts), (again.id, 2));
    let rec = eventually("the second claim to lapse", || {
        let q = q.clone();
        async move {
            let r = q.recover(Duration::from_secs(60)).await.unwrap();
            (!r.failed.is_empty()).then_some(r)
        }
    })
    .await;
    assert_eq!(rec.failed, [again.id]);
    assert!(rec.requeued.is_empty());
    assert!(q.claim(&req).await.unwrap().is_none(), "nothing left");
}

/// Heartbeats keep a claim alive; a live worker's task is not reclaimed.
pub async fn heartbeat_keeps_claims(url: String) {
    let q = open(&url).await;
    let id = q.enqueue(&task("k", "x")).await.unwrap().id;
    let mut req = claim_req("w1", 4);
    req.ttl = Duration::from_millis(300);
    q.claim(&req).await.unwrap().unwrap();
    assert!(q.started(id, "w1", 17).await.unwrap());
    for _ in 0..5 {
        q.heartbeat("w1", 4, Duration::from_millis(300), &[id])
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let r = q.recover(Duration::from_secs(60)).await.unwrap();
        assert!(r.failed.is_empty() && r.requeued.is_empty());
    }
    let st = q.status().await.unwrap();
    assert_eq!(st.leases[0].fence, Some(17));
    assert_eq!(st.leases[0].holder, "w1");
    assert_eq!(st.workers.len(), 1);
    assert_eq!(st.slots, 4);
    q.deregister("w1").await.unwrap();
    assert!(q.status().await.unwrap().workers.is_empty());
}

/// A claim its worker does not name in its heartbeat (a task its previous life under the same
/// name had started, say) is not renewed: it lapses and is recovered by its policy, while the
/// named one is kept.
pub async fn unnamed_claims_lapse(url: String) {
    let q = open(&url).await;
    let kept = q.enqueue(&task("a", "kept")).await.unwrap().id;
    let unnamed = q.enqueue(&task("b", "unnamed")).await.unwrap().id;
    let mut req = claim_req("w", 4);
    req.ttl = Duration::from_millis(300);
    for id in [kept, unnamed] {
        assert_eq!(q.claim(&req).await.unwrap().map(|t| t.id), Some(id));
        assert!(q.started(id, "w", 1).await.unwrap());
    }
    let r = eventually("the unnamed claim recovered", || {
        let q = q.clone();
        async move {
            q.heartbeat("w", 4, Duration::from_millis(300), &[kept])
                .await
                .unwrap();
            let r = q.recover(Duration::from_secs(60)).await.unwrap();
            (!r.failed.is_empty()).then_some(r)
        }
    })
    .await;
    assert_eq!(r.failed, [unnamed], "at-most-once: failed, not run again");
    assert_eq!(q.claims("w").await.unwrap(), [(kept, true)]);
}

/// A worker's claims: its running tasks, each with whether it was started; not another worker's,
/// not ended ones.
pub async fn claims_are_the_workers_running_tasks(url: String) {
    let q = open(&url).await;
    let a = q.enqueue(&task("a", "1")).await.unwrap().id;
    let b = q.enqueue(&task("b", "2")).await.unwrap().id;
    let c = q.enqueue(&task("c", "3")).await.unwrap().id;
    let d = q.enqueue(&task("d", "4")).await.unwrap().id;
    for (worker, id) in [("w", a), ("w", b), ("other", c), ("w", d)] {
        assert_eq!(
            q.claim(&claim_req(worker, 8)).await.unwrap().map(|t| t.id),
            Some(id)
        );
    }
    assert!(q.started(b, "w", 7).await.unwrap());
    assert!(q.finish(d, "w", &Outcome::Succeeded).await.unwrap());
    assert_eq!(q.claims("w").await.unwrap(), [(a, false), (b, true)]);
    assert_eq!(q.claims("other").await.unwrap(), [(c, false)]);
    assert!(q.claims("nobody").await.unwrap().is_empty());
    // Given back, a claim is no longer the worker's.
    assert!(q.unclaim(a, "w").await.unwrap());
    assert_eq!(q.claims("w").await.unwrap(), [(b, true)]);
}

/// Cancel: pending → cancelled; running → its worker is told; ended → said so; unknown id → a
/// typed error.
pub async fn cancel_and_unknown_ids(url: String) {
    let q = open(&url).await;
    let run = q.enqueue(&task("k", "run")).await.unwrap().id;
    let wait = q.enqueue(&task("k", "wait")).await.unwrap().id;
    assert_eq!(q.cancel(wait).await.unwrap(), Cancelled::Cancelled);
    q.claim(&claim_req("w", 4)).await.unwrap().unwrap();
    assert_eq!(q.cancel(run).await.unwrap(), Cancelled::Requested);
    let asks = q
        .heartbeat("w", 4, Duration::from_secs(2), &[run])
        .await
        .unwrap();
    assert_eq!(asks, [(run, CancelReason::Cancelled)]);
    assert!(q
        .finish(run, "w", &Outcome::Cancelled("cancelled".into()))
        .await
        .unwrap());
    assert_eq!(
        q.cancel(run).await.unwrap(),
        Cancelled::AlreadyEnded(TaskState::Cancelled)
    );
    assert!(matches!(
        q.cancel(999_999).await,
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(q.get(999_999).await, Err(Error::NotFound { .. })));
    assert!(matches!(
        q.cancel(u64::MAX).await,
        Err(Error::NotFound { .. })
    ));
    assert!(q.claim(&claim_req("w", 4)).await.unwrap().is_none());
    let all = q.list(true, 100).await.unwrap();
    assert_eq!(all.len(), 2);
    assert!(q.list(false, 100).await.unwrap().is_empty());
}

/// `cleanup` deletes ended tasks (succeeded, failed, cancelled) old enough, never pending or
/// running ones; a key whose tasks all went is served again when it comes back.
pub async fn cleanup_deletes_only_ended_tasks(url: String) {
    let q = open(&url).await;
    let mut ended = vec![];
    for key in ["a", "b"] {
        q.enqueue(&task(key, key)).await.unwrap();
    }
    for outcome in [Outcome::Succeeded, Outcome::Failed("exit 1".into())] {
        let t = q.claim(&claim_req("w", 4)).await.unwrap().unwrap();
        assert!(q.finish(t.id, "w", &outcome).await.unwrap());
        ended.push(t.id);
    }
    let cancelled = q.enqueue(&task("c", "c")).await.unwrap().id;
    assert_eq!(q.cancel(cancelled).await.unwrap(), Cancelled::Cancelled);
    ended.push(cancelled);
    let running = q.enqueue(&task("r", "r")).await.unwrap().id;
    assert_eq!(
        q.claim(&claim_req("w", 4)).await.unwrap().unwrap().id,
        running
    );
    let pending = q.enqueue(&task("p", "p")).await.unwrap().id;

    assert_eq!(
        q.cleanup(Duration::from_secs(3600)).await.unwrap(),
        0,
        "all ended just now"
    );
    assert_eq!(q.list(true, 100).await.unwrap().len(), 5);
    assert_eq!(q.cleanup(Duration::ZERO).await.unwrap(), 3);
    for id in ended {
        assert!(
            matches!(q.get(id).await, Err(Error::NotFound { .. })),
            "task {id}"
        );
    }
    for id in [running, pending] {
        q.get(id).await.unwrap();
    }
    assert_eq!(q.list(true, 100).await.unwrap().len(), 2);
    assert_eq!(q.cleanup(Duration::ZERO).await.unwrap(), 0, "nothing more");
    // Key `a` is back: its task is claimed like any other.
    let again = q.enqueue(&task("a", "again")).await.unwrap().id;
    let claimed: HashSet<u64> = [
        q.claim(&claim_req("w", 4)).await.unwrap().unwrap().id,
        q.claim(&claim_req("w", 4)).await.unwrap().unwrap().id,
    ]
    .into();
    assert_eq!(claimed, [pending, again].into());
}

/// Workers that enqueue, claim and finish tasks of a few keys over and over while `cleanup`
/// deletes the ended ones in a loop on another connection: every task left pending is still
/// claimable afterwards (no key's bookkeeping is taken from under a task being added).
pub async fn cleanup_beside_enqueuers_loses_nothing(url: String) {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cleaner = {
        let (q, stop) = (open(&url).await, stop.clone());
        tokio::spawn(async move {
            let (mut rounds, mut deleted) = (0u32, 0u64);
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                deleted += q.cleanup(Duration::ZERO).await.unwrap();
                rounds += 1;
            }
            // One round after the workers stopped: a round that waited behind them for the
            // whole run (a busy SQLite writer lock on a loaded machine) is not the only one.
            deleted += q.cleanup(Duration::ZERO).await.unwrap();
            (rounds + 1, deleted)
        })
    };
    let mut workers = vec![];
    for w in 0..4 {
        let q = open(&url).await;
        workers.push(tokio::spawn(async move {
            let worker = format!("w{w}");
            for i in 0..40 {
                q.enqueue(&task(&format!("k{}", (w + i) % 3), "x"))
                    .await
                    .unwrap();
                if let Some(t) = q.claim(&claim_req(&worker, 4)).await.unwrap() {
                    assert!(q.finish(t.id, &worker, &Outcome::Succeeded).await.unwrap());
                }
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (rounds, deleted) = cleaner.await.unwrap();
    assert!(
        deleted > 0,
        "the cleaner deleted no ended task in {rounds} rounds"
    );
    let q = open(&url).await;
    while let Some(t) = q.claim(&claim_req("last", 4)).await.unwrap() {
        assert!(q.finish(t.id, "last", &Outcome::Succeeded).await.unwrap());
    }
    let s = q.status().await.unwrap();
    assert_eq!(
        s.pending.high + s.pending.normal + s.pending.low,
        0,
        "a pending task no claim finds"
    );
}

/// The first `recover` that found tasks past their timeout: its report.
async fn until_timed_out(q: &Arc<dyn QueueBackend>) -> leasehold::queue::Recovered {
    eventually("a timeout", || {
        let q = q.clone();
        async move {
            let r = q.recover(Duration::from_secs(60)).await.unwrap();
            (!r.timed_out.is_empty()).then_some(r)
        }
    })
    .await
}

/// A task past its timeout gets a timeout request for its worker.
pub async fn timeouts_are_requested(url: String) {
    let q = open(&url).await;
    let mut t = task("k", "slow");
    t.timeout = Some(Duration::from_millis(50));
    let id = q.enqueue(&t).await.unwrap().id;
    q.claim(&claim_req("w", 4)).await.unwrap().unwrap();
    let r = until_timed_out(&q).await;
    assert_eq!(r.timed_out, [id]);
    let asks = q
        .heartbeat("w", 4, Duration::from_secs(2), &[id])
        .await
        .unwrap();
    assert_eq!(asks, [(id, CancelReason::Timeout)]);
}

/// A timeout as long as the queue stores (`i64::MAX` ms) never runs out, and a running task with
/// one does not stop the sweep from asking for the timeouts of the others.
pub async fn a_huge_timeout_never_runs_out(url: String) {
    let q = open(&url).await;
    let mut forever = task("a", "forever");
    forever.timeout = Some(Duration::from_millis(u64::MAX));
    let long = q.enqueue(&forever).await.unwrap().id;
    let mut t = task("b", "slow");
    t.timeout = Some(Duration::from_millis(50));
    let short = q.enqueue(&t).await.unwrap().id;
    q.claim(&claim_req("w", 4)).await.unwrap().unwrap();
    q.claim(&claim_req("w", 4)).await.unwrap().unwrap();
    let r = until_timed_out(&q).await;
    assert_eq!(r.timed_out, [short], "the task of timeout {long} ran out");
}

/// Aging: a low task waiting long enough overtakes newer normal ones; it never starves.
pub async fn aging_prevents_starvation(url: String) {
    let q = open(&url).await;
    let mut low = task("k", "low");
    low.priority = Priority::Low;
    q.enqueue(&low).await.unwrap();
    let aging = Duration::from_millis(30);
    eventually("two agings", || {
        let q = q.clone();
        async move {
            q.recover(aging).await.unwrap();
            let t = match q.list(false, 10).await.unwrap().pop() {
                Some(TaskEntry::Task(t)) => t,
                _ => return None,
            };
            (t.effective == Priority::High).then_some(())
        }
    })
    .await;
    q.enqueue(&task("k", "normal")).await.unwrap();
    let first = q.claim(&claim_req("w", 1)).await.unwrap().unwrap();
    assert_eq!(first.payload, "low");
    assert_eq!(first.priority, Priority::Low);
}

/// Bad input is a typed error: bad key, empty group, zero timeout, zero attempts.
pub async fn bad_input_is_refused(url: String) {
    let q = open(&url).await;
    assert!(matches!(
        q.enqueue(&task("", "x")).await,
        Err(Error::InvalidKey { .. })
    ));
    assert!(matches!(
        q.enqueue(&task("a\0b", "x")).await,
        Err(Error::InvalidKey { .. })
    ));
    let mut t = task("k", "x");
    t.group = Some(String::new());
    assert!(matches!(
        q.enqueue(&t).await,
        Err(Error::InvalidOption { .. })
    ));
    let mut t = task("k", "x");
    t.timeout = Some(Duration::ZERO);
    assert!(matches!(
        q.enqueue(&t).await,
        Err(Error::InvalidOption { .. })
    ));
    let mut t = task("k", "x");
    t.policy = Policy::AtLeastOnce { max_attempts: 0 };
    assert!(matches!(
        q.enqueue(&t).await,
        Err(Error::InvalidOption { .. })
    ));
    assert_eq!(q.status().await.unwrap().keys_total, 0);
}

/// Eight handles (separate connections) race to claim 40 tasks of 10 keys with capacity 4: every
/// task is claimed exactly once, never two of a key nor more than 4 at a time.
pub async fn racing_claimers(url: String) {
    let q = open(&url).await;
    for k in 0..10 {
        for i in 0..4 {
            q.enqueue(&task(&format!("k{k}"), &format!("{k}/{i}")))
                .await
                .unwrap();
        }
    }
    let state = Arc::new(std::sync::Mutex::new((
        HashSet::<String>::new(),
        0usize,
        Vec::<u64>::new(),
    )));
    let mut handles = vec![];
    for w in 0..8 {
        let url = url.clone();
        let state = state.clone();
        handles.push(tokio::spawn(async move {
            let q = open(&url).await;
            let me = format!("w{w}");
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let done = state.lock().unwrap().2.len();
                if done == 40 {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "racing claimers stalled at {done}"
                );
                let Some(t) = q.claim(&claim_req(&me, 4)).await.unwrap() else {
                    q.changed(Duration::from_millis(5)).await;
                    continue;
                };
                {
                    let mut s = state.lock().unwrap();
                    assert!(s.0.insert(t.key.clone()), "two tasks of {} at once", t.key);
                    s.1 += 1;
                    assert!(s.1 <= 4, "more than 4 running");
                }
                tokio::time::sleep(Duration::from_millis(fastrand::u64(0..5))).await;
                {
                    let mut s = state.lock().unwrap();
                    s.0.remove(&t.key);
                    s.1 -= 1;
                    s.2.push(t.id);
                }
                assert!(q.finish(t.id, &me, &Outcome::Succeeded).await.unwrap());
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let mut ids = state.lock().unwrap().2.clone();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 40, "every task exactly once");
    assert_eq!(q.status().await.unwrap().succeeded, 40);
}

/// Generates one `#[tokio::test]` per queue-suite function for queues made by `$make` (an async
/// expression returning the URL of a fresh, empty queue).
#[macro_export]
macro_rules! queue_tests {
    ($make:expr) => {
        $crate::queue_tests!(@each $make;
            priority_then_arrival_within_a_key, one_per_key_and_global_slots, fair_across_keys,
            group_limit, dead_worker_by_policy, heartbeat_keeps_claims,
            claims_are_the_workers_running_tasks, unnamed_claims_lapse, cancel_and_unknown_ids,
            timeouts_are_requested, a_huge_timeout_never_runs_out, aging_prevents_starvation, bad_input_is_refused,
            racing_claimers, cleanup_deletes_only_ended_tasks,
            cleanup_beside_enqueuers_loses_nothing);
    };
    (@each $make:expr; $($name:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let url: String = $make;
                $crate::queue_suite::$name(url).await;
            }
        )*
    };
}
