//! The library's queue [`Worker`] run in-process with async closures, on SQLite and on the
//! PostgreSQL server the test kit starts; the key leases come from a file store. Each scenario is
//! one `async fn` over a queue URL, run on both.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::queue::worker::{RunningTask, TaskStop, Worker};
use leasehold::queue::{open_queue, NewTask, Outcome, QueueBackend, TaskEntry, TaskState};
use leasehold::{HolderId, Key, Locks, LostReason};
use leasehold_testkit::servers::shared_postgres;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

fn sqlite(dir: &Path) -> String {
    format!("sqlite://{}/queue.db", dir.display())
}

/// Locks over the file store in `dir`, held as `name`.
async fn locks(dir: &Path, name: &str) -> Locks {
    leasehold::connect(&format!("file://{}/locks", dir.display()))
        .await
        .unwrap()
        .with_holder(HolderId::new(name))
}

/// Polls `done` (bounded) until it holds.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The task `id` as stored.
async fn task(q: &Arc<dyn QueueBackend>, id: u64) -> leasehold::queue::Task {
    match q.get(id).await.unwrap() {
        TaskEntry::Task(t) => t,
        other => panic!("{other:?}"),
    }
}

/// What the runners saw: per key, whether a task runs now, and the fences in run order.
#[derive(Default)]
struct Seen {
    inside: HashMap<String, bool>,
    fences: HashMap<String, Vec<u64>>,
    overlaps: Vec<String>,
    ran: usize,
}

/// Two workers (4 slots in all, each its own holder) run 3 keys × 6 tasks: all succeed, the
/// tasks of a key never overlap and run with increasing fences; both drain and deregister.
async fn tasks_of_a_key_never_overlap_and_all_complete(url: &str, dir: &Path) {
    let q = open_queue(url).await.unwrap();
    let mut ids = vec![];
    for i in 0..6 {
        for key in ["a", "b", "c"] {
            ids.push(
                q.enqueue(&NewTask::new(key, format!("{i}")))
                    .await
                    .unwrap()
                    .id,
            );
        }
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut workers = vec![];
    for name in ["w1", "w2"] {
        let worker = Worker::new(open_queue(url).await.unwrap(), locks(dir, name).await)
            .slots(4)
            .ttl(Duration::from_secs(3));
        let shutdown = worker.shutdown_handle();
        let seen = seen.clone();
        let run = tokio::spawn(worker.run(move |task: RunningTask| {
            let seen = seen.clone();
            async move {
                let key = task.task().key.clone();
                {
                    let mut s = seen.lock().unwrap();
                    if std::mem::replace(s.inside.entry(key.clone()).or_default(), true) {
                        s.overlaps.push(format!("{key}: task {}", task.task().id));
                    }
                    s.fences.entry(key.clone()).or_default().push(task.fence());
                }
                assert_eq!(task.task().fence, Some(task.fence()));
                tokio::time::sleep(Duration::from_millis(15)).await;
                let mut s = seen.lock().unwrap();
                s.inside.insert(key, false);
                s.ran += 1;
                Outcome::Succeeded
            }
        }));
        workers.push((shutdown, run));
    }
    let total = ids.len();
    until("every task to run", || seen.lock().unwrap().ran == total).await;
    for (shutdown, run) in workers {
        shutdown.drain();
        run.await.unwrap().unwrap();
    }
    {
        let s = seen.lock().unwrap();
        assert!(s.overlaps.is_empty(), "overlapping runs: {:?}", s.overlaps);
        for (key, fences) in &s.fences {
            assert_eq!(fences.len(), 6, "{key}");
            assert!(fences.windows(2).all(|w| w[0] < w[1]), "{key}: {fences:?}");
        }
    }
    for id in ids {
        assert_eq!(task(&q, id).await.state, TaskState::Succeeded, "task {id}");
    }
    let status = q.status().await.unwrap();
    assert_eq!((status.succeeded, status.running), (total as u64, 0));
    assert!(
        status.workers.is_empty(),
        "deregistered: {:?}",
        status.workers
    );
}

/// The key's lease is force-released under a running task: the runner is told
/// ([`TaskStop::LeaseLost`]) and returns, the task is recorded failed for it, and the worker
/// goes on with the next task.
async fn a_lost_lease_stops_the_runner(url: &str, dir: &Path) {
    let q = open_queue(url).await.unwrap();
    let first = q.enqueue(&NewTask::new("k", "first")).await.unwrap().id;
    let locks = locks(dir, "w").await;
    let store = locks.store().clone();
    let worker = Worker::new(q.clone(), locks).ttl(Duration::from_millis(600));
    let shutdown = worker.shutdown_handle();
    let (started, mut started_rx) = mpsc::unbounded_channel();
    let (stopped, mut stopped_rx) = mpsc::unbounded_channel();
    let run = tokio::spawn(worker.run(move |task: RunningTask| {
        let (started, stopped) = (started.clone(), stopped.clone());
        async move {
            if task.task().payload != "first" {
                return Outcome::Succeeded;
            }
            started.send(task.task().id).unwrap();
            let why = task.stopped().await;
            assert_eq!(task.stop_reason(), Some(why.clone()));
            stopped.send(why.clone()).unwrap();
            why.outcome()
        }
    }));
    assert_eq!(started_rx.recv().await, Some(first));
    store.force_release(&Key::new("k").unwrap()).await.unwrap();
    let why = tokio::time::timeout(Duration::from_secs(5), stopped_rx.recv())
        .await
        .expect("the runner is told within a renewal period")
        .unwrap();
    assert_eq!(why, TaskStop::LeaseLost(LostReason::Released));
    let mut ended = task(&q, first).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while ended.state == TaskState::Running && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        ended = task(&q, first).await;
    }
    assert_eq!(ended.state, TaskState::Failed);
    let detail = ended.detail.unwrap_or_default();
    assert!(detail.starts_with("the key's lease was lost"), "{detail}");
    // The worker goes on: the key's next task runs.
    let next = q.enqueue(&NewTask::new("k", "next")).await.unwrap().id;
    let deadline = Instant::now() + Duration::from_secs(10);
    while task(&q, next).await.state != TaskState::Succeeded {
        assert!(Instant::now() < deadline, "the next task did not run");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.drain();
    run.await.unwrap().unwrap();
}

/// Sets a flag when dropped: whether a runner's future was dropped.
struct Dropped(Arc<Mutex<bool>>);

impl Drop for Dropped {
    fn drop(&mut self) {
        *self.0.lock().unwrap() = true;
    }
}

/// An operator cancels a running task whose runner ignores the stop: the worker drops the
/// runner once the stop grace has passed and records the task cancelled.
async fn a_runner_that_ignores_a_cancel_is_dropped(url: &str, dir: &Path) {
    let q = open_queue(url).await.unwrap();
    let id = q.enqueue(&NewTask::new("k", "x")).await.unwrap().id;
    let worker = Worker::new(q.clone(), locks(dir, "w").await)
        .ttl(Duration::from_millis(300))
        .stop_grace(Duration::from_millis(200));
    let shutdown = worker.shutdown_handle();
    let dropped = Arc::new(Mutex::new(false));
    let flag = dropped.clone();
    let run = tokio::spawn(worker.run(move |_task: RunningTask| {
        let guard = Dropped(flag.clone());
        async move {
            let _guard = guard;
            tokio::time::sleep(Duration::from_secs(60)).await;
            Outcome::Succeeded
        }
    }));
    let deadline = Instant::now() + Duration::from_secs(10);
    while task(&q, id).await.fence.is_none() {
        assert!(Instant::now() < deadline, "the task did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    q.cancel(id).await.unwrap();
    let mut ended = task(&q, id).await;
    while ended.state == TaskState::Running {
        assert!(Instant::now() < deadline, "the task did not end");
        tokio::time::sleep(Duration::from_millis(20)).await;
        ended = task(&q, id).await;
    }
    assert_eq!(
        (ended.state, ended.detail.as_deref()),
        (TaskState::Cancelled, Some("cancelled"))
    );
    assert!(*dropped.lock().unwrap(), "the runner was dropped");
    shutdown.drain();
    run.await.unwrap().unwrap();
}

#[tokio::test]
async fn sqlite_tasks_of_a_key_never_overlap_and_all_complete() {
    let dir = tempfile::tempdir().unwrap();
    tasks_of_a_key_never_overlap_and_all_complete(&sqlite(dir.path()), dir.path()).await;
}

#[tokio::test]
async fn postgres_tasks_of_a_key_never_overlap_and_all_complete() {
    let dir = tempfile::tempdir().unwrap();
    let url = shared_postgres().fresh_db();
    tasks_of_a_key_never_overlap_and_all_complete(&url, dir.path()).await;
}

#[tokio::test]
async fn sqlite_a_lost_lease_stops_the_runner() {
    let dir = tempfile::tempdir().unwrap();
    a_lost_lease_stops_the_runner(&sqlite(dir.path()), dir.path()).await;
}

#[tokio::test]
async fn postgres_a_lost_lease_stops_the_runner() {
    let dir = tempfile::tempdir().unwrap();
    let url = shared_postgres().fresh_db();
    a_lost_lease_stops_the_runner(&url, dir.path()).await;
}

#[tokio::test]
async fn sqlite_a_runner_that_ignores_a_cancel_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    a_runner_that_ignores_a_cancel_is_dropped(&sqlite(dir.path()), dir.path()).await;
}

#[tokio::test]
async fn postgres_a_runner_that_ignores_a_cancel_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let url = shared_postgres().fresh_db();
    a_runner_that_ignores_a_cancel_is_dropped(&url, dir.path()).await;
}

/// A worker cut off from its lock store (Redis through a proxy that stops forwarding) with a
/// runner that ignores being told to stop: the runner is told at the lease's stop-by deadline
/// (`LeaseLost`, with the deadline it must be gone by: the lease's `valid_until`), and dropped at
/// that deadline — not `stop_grace` (here 30 s) after `lost()`.
async fn a_runner_cut_off_from_the_store_is_dropped_at_the_lease_s_deadline(url: &str) {
    use leasehold_testkit::{proxy::TcpProxy, servers::RedisServer};
    let redis = RedisServer::start();
    let proxy = TcpProxy::start(redis.port);
    let q = open_queue(url).await.unwrap();
    let id = q.enqueue(&NewTask::new("k", "x")).await.unwrap().id;
    let locks = leasehold::connect(&format!("redis://127.0.0.1:{}/0", proxy.port))
        .await
        .unwrap()
        .with_holder(HolderId::new("w"));
    let ttl = Duration::from_secs(1);
    let worker = Worker::new(q.clone(), locks)
        .ttl(ttl)
        .stop_grace(Duration::from_secs(30));
    let shutdown = worker.shutdown_handle();
    let dropped = Arc::new(Mutex::new(None));
    let (told, mut told_rx) = mpsc::unbounded_channel();
    let (started, mut started_rx) = mpsc::unbounded_channel();
    let flag = dropped.clone();
    let run = tokio::spawn(worker.run(move |task: RunningTask| {
        let (flag, told, started) = (flag.clone(), told.clone(), started.clone());
        async move {
            struct At(Arc<Mutex<Option<Instant>>>);
            impl Drop for At {
                fn drop(&mut self) {
                    *self.0.lock().unwrap() = Some(Instant::now());
                }
            }
            let _at = At(flag);
            assert_eq!(task.deadline(), None, "the lease is healthy");
            started.send(()).unwrap();
            let why = task.stopped().await;
            told.send((why, task.deadline(), Instant::now())).unwrap();
            // Ignores the stop.
            tokio::time::sleep(Duration::from_secs(60)).await;
            Outcome::Succeeded
        }
    }));
    started_rx.recv().await.unwrap();
    let cut = Instant::now();
    proxy.pause();
    let (why, deadline, at) = tokio::time::timeout(Duration::from_secs(5), told_rx.recv())
        .await
        .expect("told within the TTL")
        .unwrap();
    assert!(
        matches!(why, TaskStop::LeaseLost(LostReason::Unreachable { .. })),
        "{why:?}"
    );
    let deadline = deadline.expect("a lease stop has a deadline");
    let deadline = Instant::now() + deadline.saturating_duration_since(tokio::time::Instant::now());
    assert!(at < deadline, "told before the lease's deadline");
    assert!(at < cut + ttl, "told before the lease could expire");
    let mut ended = task(&q, id).await;
    let limit = Instant::now() + Duration::from_secs(10);
    while ended.state == TaskState::Running {
        assert!(Instant::now() < limit, "the runner was not dropped in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
        ended = task(&q, id).await;
    }
    let dropped_at = dropped.lock().unwrap().expect("the runner was dropped");
    assert!(
        dropped_at < deadline + Duration::from_millis(100),
        "dropped {:?} after the lease's deadline",
        dropped_at.saturating_duration_since(deadline)
    );
    assert_eq!(ended.state, TaskState::Failed);
    let detail = ended.detail.unwrap_or_default();
    assert!(detail.starts_with("the key's lease was lost"), "{detail}");
    proxy.resume();
    shutdown.stop();
    let _ = tokio::time::timeout(Duration::from_secs(10), run).await;
}

#[tokio::test]
async fn sqlite_a_runner_cut_off_from_the_store_is_dropped_at_the_lease_s_deadline() {
    let dir = tempfile::tempdir().unwrap();
    a_runner_cut_off_from_the_store_is_dropped_at_the_lease_s_deadline(&sqlite(dir.path())).await;
}

/// A second worker started under a live worker's name (two pods given one `POD_NAME`) refuses
/// to start, naming the conflict, instead of giving back the first one's claims as unknown to
/// it; the first one's task runs on untouched. Once the first has stopped, the name is free.
#[tokio::test]
async fn a_second_live_worker_under_the_same_name_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite(dir.path());
    let q = open_queue(&url).await.unwrap();
    let id = q.enqueue(&NewTask::new("k", "x")).await.unwrap().id;
    let ttl = Duration::from_millis(300);
    let first = Worker::new(q.clone(), locks(dir.path(), "pod-0").await).ttl(ttl);
    let shutdown = first.shutdown_handle();
    let release = Arc::new(tokio::sync::Notify::new());
    let released = release.clone();
    let run = tokio::spawn(first.run(move |_task: RunningTask| {
        let released = released.clone();
        async move {
            released.notified().await;
            Outcome::Succeeded
        }
    }));
    let deadline = Instant::now() + Duration::from_secs(10);
    while task(&q, id).await.fence.is_none() {
        assert!(Instant::now() < deadline, "the task did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The same name, another lock store instance (as another process would open it).
    let twin = Worker::new(
        open_queue(&url).await.unwrap(),
        locks(dir.path(), "pod-0").await,
    )
    .ttl(ttl);
    let err = tokio::time::timeout(
        Duration::from_secs(10),
        twin.run(|_t: RunningTask| async { Outcome::Succeeded }),
    )
    .await
    .expect("the twin neither refused nor stopped")
    .expect_err("a second live worker under one name started");
    assert!(
        matches!(
            err,
            leasehold::Error::InvalidOption {
                name: "worker name",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("pod-0"), "{err}");
    let running = task(&q, id).await;
    assert_eq!(
        (running.state, running.worker.as_deref()),
        (TaskState::Running, Some("pod-0")),
        "the first worker's claim was kept"
    );
    release.notify_one();
    shutdown.drain();
    run.await.unwrap().unwrap();
    assert_eq!(task(&q, id).await.state, TaskState::Succeeded);
    // The name is free again.
    let again = Worker::new(q.clone(), locks(dir.path(), "pod-0").await)
        .ttl(ttl)
        .exit_when_idle(true);
    again
        .run(|_t: RunningTask| async { Outcome::Succeeded })
        .await
        .unwrap();
}
