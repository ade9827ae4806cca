//! The task queue with real processes: `leasehold queue work` workers over a queue (SQLite in a
//! temp directory, or a fresh database on a PostgreSQL server the test kit starts) and a
//! `file://` lock store in a temp directory, tasks that log their own start and end.
//!
//! Every task appends `start KEY ID FENCE NS` and `end KEY ID FENCE NS` (wall-clock ns, one host)
//! to a shared log with `>>` (O_APPEND, one short write per line); the checks are made from that
//! log, not from what the workers say.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::queue::{open_queue, NewTask, Policy, QueueBackend, TaskEntry, TaskState};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

/// A queue, a lock store and a task log in one temp directory.
struct Setup {
    dir: tempfile::TempDir,
    queue: String,
    store: String,
}

impl Setup {
    /// A SQLite queue.
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let queue = format!("sqlite://{}", dir.path().join("queue.db").display());
        Self::with_queue(dir, queue)
    }

    /// A PostgreSQL queue (a fresh database).
    fn postgres() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let queue = leasehold_testkit::servers::shared_postgres().fresh_db();
        Self::with_queue(dir, queue)
    }

    /// A PostgreSQL queue on a server that requires TLS, over `sslmode=verify-full` (a fresh
    /// database).
    fn postgres_tls() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let queue = leasehold_testkit::servers::shared_postgres_tls().fresh_db();
        assert!(queue.contains("sslmode=verify-full"), "{queue}");
        Self::with_queue(dir, queue)
    }

    fn with_queue(dir: tempfile::TempDir, queue: String) -> Self {
        let store = format!("file://{}", dir.path().join("locks").display());
        Setup { dir, queue, store }
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("tasks.log")
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new(BIN);
        c.env("LEASEHOLD_QUEUE", &self.queue)
            .env("LEASEHOLD_STORE", &self.store)
            .env_remove("LEASEHOLD_LOG");
        c
    }

    async fn open(&self) -> Arc<dyn QueueBackend> {
        open_queue(&self.queue).await.unwrap()
    }

    /// A worker process; its stderr goes to `worker-N.err` in the temp dir.
    fn worker(&self, n: usize, args: &[&str]) -> Worker {
        self.worker_with(n, args, self.cmd())
    }

    /// [`Setup::worker`] named `namespace/name`, as the downward API names a pod's.
    fn worker_as(&self, n: usize, (namespace, name): (&str, &str), args: &[&str]) -> Worker {
        let mut cmd = self.cmd();
        cmd.env("POD_NAMESPACE", namespace).env("POD_NAME", name);
        self.worker_with(n, args, cmd)
    }

    fn worker_with(&self, n: usize, args: &[&str], mut cmd: Command) -> Worker {
        let err = std::fs::File::create(self.dir.path().join(format!("worker-{n}.err"))).unwrap();
        cmd.args(["queue", "work"]);
        if !args.contains(&"--ttl") {
            cmd.args(["--ttl", "1s"]);
        }
        let child = cmd
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap();
        Worker(Some(child))
    }

    fn worker_errors(&self) -> String {
        let mut out = String::new();
        for n in 0..4 {
            if let Ok(s) = std::fs::read_to_string(self.dir.path().join(format!("worker-{n}.err")))
            {
                out.push_str(&format!("--- worker {n}\n{s}"));
            }
        }
        out
    }

    /// The payload of a task that logs its start, sleeps `ms`, logs its end.
    fn task(&self, ms: u64) -> String {
        let log = self.log().display().to_string();
        let script = format!(
            "echo \"start $LEASEHOLD_KEY $LEASEHOLD_TASK_ID $LEASEHOLD_FENCE $(date +%s%N)\" >> '{log}'; \
             sleep {}; \
             echo \"end $LEASEHOLD_KEY $LEASEHOLD_TASK_ID $LEASEHOLD_FENCE $(date +%s%N)\" >> '{log}'",
            ms as f64 / 1000.0
        );
        serde_json::json!({ "argv": ["sh", "-c", script] }).to_string()
    }

    fn events(&self) -> Vec<Event> {
        let text = std::fs::read_to_string(self.log()).unwrap_or_default();
        text.lines()
            .map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                assert_eq!(f.len(), 5, "bad log line {l:?}");
                Event {
                    start: f[0] == "start",
                    key: f[1].to_owned(),
                    id: f[2].parse().unwrap(),
                    fence: f[3].parse().unwrap(),
                    ns: f[4].parse().unwrap(),
                }
            })
            .collect()
    }

    /// Waits (polling the log, bounded) until `pred` holds for its events.
    fn await_log(&self, what: &str, pred: impl Fn(&[Event]) -> bool) -> Vec<Event> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ev = self.events();
            if pred(&ev) {
                return ev;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[derive(Debug, Clone)]
struct Event {
    start: bool,
    key: String,
    id: u64,
    fence: u64,
    ns: u64,
}

/// A worker process. A test that ends without waiting for it (a failed assertion) kills it, even
/// paused with SIGSTOP, so that it does not outlive the test.
struct Worker(Option<Child>);

impl Worker {
    fn id(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            // SIGKILL ends a stopped process too.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Waits for a worker to exit, at most `limit`.
fn wait_for(mut worker: Worker, limit: Duration) -> ExitStatus {
    let Some(mut child) = worker.0.take() else {
        panic!("the worker was already waited for");
    };
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    match rx.recv_timeout(limit) {
        Ok(status) => status.unwrap(),
        Err(_) => {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("process {pid} did not exit within {limit:?}");
        }
    }
}

/// Wall-clock ns, the clock the tasks log with.
fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// Task intervals `(key, id, fence, start, end)`; a start without an end ends at `open_end` (when
/// its worker was killed, taking the task with it; `u64::MAX`: still running).
fn intervals(ev: &[Event], open_end: u64) -> Vec<(String, u64, u64, u64, u64)> {
    let mut open: HashMap<(u64, u64), (String, u64)> = HashMap::new();
    let mut out = vec![];
    for e in ev {
        if e.start {
            open.insert((e.id, e.fence), (e.key.clone(), e.ns));
        } else if let Some((key, s)) = open.remove(&(e.id, e.fence)) {
            out.push((key, e.id, e.fence, s, e.ns));
        }
    }
    for ((id, fence), (key, s)) in open {
        out.push((key, id, fence, s, open_end));
    }
    out
}

/// No two tasks of one key overlap; at most `slots` overlap in all.
fn check_exclusion(ev: &[Event], slots: usize, open_end: u64) {
    let iv = intervals(ev, open_end);
    let mut by_key: BTreeMap<&str, Vec<(u64, u64, u64)>> = BTreeMap::new();
    for (k, id, _, s, e) in &iv {
        by_key.entry(k).or_default().push((*s, *e, *id));
    }
    for (k, mut v) in by_key {
        v.sort_unstable();
        for w in v.windows(2) {
            assert!(
                w[0].1 <= w[1].0,
                "two tasks of key {k} at once: {:?} and {:?}",
                w[0],
                w[1]
            );
        }
    }
    let mut points: Vec<(u64, i32)> = iv
        .iter()
        .flat_map(|(_, _, _, s, e)| [(*s, 1), (*e, -1)])
        .collect();
    // Ends before starts at the same instant.
    points.sort_unstable();
    let (mut now, mut max) = (0i32, 0i32);
    for (_, d) in points {
        now += d;
        max = max.max(now);
    }
    assert!(
        max as usize <= slots,
        "{max} tasks ran at once with {slots} slots"
    );
}

/// A task of `s` (key `k`, 10 ms) enqueued and claimed as worker `ns/w` (the name
/// [`Setup::worker_as`] gives with `("ns", "w")`); its id.
async fn claimed_as_ns_w(s: &Setup, q: &Arc<dyn QueueBackend>) -> u64 {
    let id = q.enqueue(&NewTask::new("k", s.task(10))).await.unwrap().id;
    let req = leasehold::queue::ClaimRequest {
        worker: "ns/w".into(),
        max_running: 1,
        group_limit: None,
        ttl: Duration::from_secs(1),
    };
    assert_eq!(q.claim(&req).await.unwrap().map(|t| t.id), Some(id));
    id
}

/// A claim the worker never heard of (the database recorded it, but its answer was lost: the
/// connection ended, or the call's bound ran out, after the commit) goes back to the queue at the
/// worker's next heartbeat, and runs — rather than being kept by the worker's heartbeats, holding
/// its key and a slot for as long as the worker lives.
#[tokio::test]
async fn a_claim_whose_answer_was_lost_goes_back_and_runs() {
    for s in [Setup::new(), Setup::postgres()] {
        let q = s.open().await;
        // The claim, recorded as the worker's, whose answer the worker never got.
        let id = claimed_as_ns_w(&s, &q).await;
        let w = s.worker_as(0, ("ns", "w"), &["--slots", "1", "--exit-when-idle"]);
        s.await_log("the task ran", |ev| {
            ev.iter().any(|e| !e.start && e.id == id)
        });
        assert!(
            wait_for(w, Duration::from_secs(20)).success(),
            "{}",
            s.worker_errors()
        );
        assert!(
            s.worker_errors().contains("never heard of"),
            "{}",
            s.worker_errors()
        );
    }
}

/// A worker restarted under the same name (a StatefulSet pod) does not keep the task its previous
/// life had started (whose command died with it): the claim lapses and is recovered by its
/// policy (at-most-once: failed), freeing its key.
#[tokio::test]
async fn a_task_started_by_a_previous_life_of_the_worker_is_recovered() {
    for s in [Setup::new(), Setup::postgres()] {
        let q = s.open().await;
        let id = claimed_as_ns_w(&s, &q).await;
        assert!(q.started(id, "ns/w", 1).await.unwrap());
        let w = s.worker_as(0, ("ns", "w"), &["--slots", "1", "--exit-when-idle"]);
        assert!(
            wait_for(w, Duration::from_secs(20)).success(),
            "{}",
            s.worker_errors()
        );
        match q.get(id).await.unwrap() {
            TaskEntry::Task(t) => assert_eq!(t.state, TaskState::Failed, "{t:?}"),
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_200_tasks_one_per_key_slots_exactly_once() {
    two_workers_200_tasks(Setup::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_two_workers_200_tasks_one_per_key_slots_exactly_once() {
    two_workers_200_tasks(Setup::postgres()).await;
}

/// The same over TLS: the workers' and the CLI's connections verify the server's certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls_two_workers_200_tasks_one_per_key_slots_exactly_once() {
    two_workers_200_tasks(Setup::postgres_tls()).await;
}

async fn two_workers_200_tasks(s: Setup) {
    let q = s.open().await;
    let mut tasks = vec![];
    for _ in 0..20 {
        for k in 0..10 {
            tasks.push(NewTask::new(
                format!("user{k}"),
                s.task(fastrand::u64(0..30)),
            ));
        }
    }
    let ids: Vec<u64> = q
        .enqueue_batch(&tasks)
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    let a = s.worker(0, &["--slots", "4", "--exit-when-idle"]);
    let b = s.worker(1, &["--slots", "4", "--exit-when-idle"]);
    let (sa, sb) = (
        wait_for(a, Duration::from_secs(90)),
        wait_for(b, Duration::from_secs(90)),
    );
    assert!(sa.success() && sb.success(), "{}", s.worker_errors());
    let ev = s.events();
    check_exclusion(&ev, 4, u64::MAX);
    let mut starts: HashMap<u64, usize> = HashMap::new();
    for e in ev.iter().filter(|e| e.start) {
        *starts.entry(e.id).or_default() += 1;
    }
    for id in &ids {
        assert_eq!(
            starts.get(id),
            Some(&1),
            "task {id} started {:?} times",
            starts.get(id)
        );
    }
    assert_eq!(ev.iter().filter(|e| !e.start).count(), 200);
    let st = q.status().await.unwrap();
    assert_eq!(st.succeeded, 200, "{st:?}\n{}", s.worker_errors());
    // Both workers took part.
    let all = q.list(true, 1000).await.unwrap();
    let workers: std::collections::HashSet<_> = all
        .iter()
        .filter_map(|e| match e {
            TaskEntry::Task(t) => t.worker.clone(),
            _ => None,
        })
        .collect();
    assert_eq!(workers.len(), 2, "{workers:?}");
}

#[tokio::test]
async fn a_quiet_key_starts_within_one_round_behind_a_busy_one() {
    quiet_key_within_one_round(Setup::new()).await;
}

#[tokio::test]
async fn postgres_a_quiet_key_starts_within_one_round_behind_a_busy_one() {
    quiet_key_within_one_round(Setup::postgres()).await;
}

async fn quiet_key_within_one_round(s: Setup) {
    let q = s.open().await;
    let mut tasks: Vec<NewTask> = (0..100).map(|_| NewTask::new("busy", s.task(0))).collect();
    tasks.push(NewTask::new("quiet", s.task(0)));
    q.enqueue_batch(&tasks).await.unwrap();
    let w = s.worker(0, &["--slots", "1", "--exit-when-idle"]);
    // Only the first rounds matter: wait for the quiet task or 3 starts, then stop the worker.
    let ev = s.await_log("the quiet task", |ev| {
        ev.iter().any(|e| e.start && e.key == "quiet") || ev.iter().filter(|e| e.start).count() > 2
    });
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(w.id() as i32, libc::SIGTERM) };
    let status = wait_for(w, Duration::from_secs(20));
    assert!(status.success(), "{}", s.worker_errors());
    let order: Vec<&str> = ev
        .iter()
        .filter(|e| e.start)
        .map(|e| e.key.as_str())
        .collect();
    assert_eq!(&order[..2], ["busy", "quiet"], "{order:?}");
}

#[tokio::test]
async fn a_killed_worker_s_tasks_are_recovered_by_policy() {
    killed_worker(Setup::new()).await;
}

#[tokio::test]
async fn postgres_a_killed_worker_s_tasks_are_recovered_by_policy() {
    killed_worker(Setup::postgres()).await;
}

async fn killed_worker(s: Setup) {
    let q = s.open().await;
    let mut again = NewTask::new("k1", s.task(1500));
    again.policy = Policy::AtLeastOnce { max_attempts: 3 };
    let mut once = NewTask::new("k2", s.task(1500));
    once.policy = Policy::AtMostOnce;
    let ids = q
        .enqueue_batch(&[
            again,
            once,
            NewTask::new("k1", s.task(10)),
            NewTask::new("k2", s.task(10)),
            NewTask::new("k3", s.task(10)),
        ])
        .await
        .unwrap();
    let (again_id, once_id) = (ids[0].id, ids[1].id);
    let a = s.worker(0, &["--slots", "2"]);
    s.await_log("both long tasks to start", |ev| {
        ev.iter().filter(|e| e.start).count() >= 2
    });
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(a.id() as i32, libc::SIGKILL) };
    assert!(!wait_for(a, Duration::from_secs(10)).success());
    // The killed worker's tasks die with it (PR_SET_PDEATHSIG): their attempts end here.
    let killed_at = now_ns();
    let b = s.worker(1, &["--slots", "4", "--exit-when-idle"]);
    assert!(
        wait_for(b, Duration::from_secs(30)).success(),
        "{}",
        s.worker_errors()
    );
    let ev = s.events();
    check_exclusion(&ev, 4, killed_at);
    let starts = |id: u64| ev.iter().filter(|e| e.start && e.id == id).count();
    let ends = |id: u64| ev.iter().filter(|e| !e.start && e.id == id).count();
    // at-least-once: started again and completed once; the killed attempt never logged an end
    // (it died with its worker).
    assert_eq!((starts(again_id), ends(again_id)), (2, 1));
    // at-most-once: never started again.
    assert_eq!((starts(once_id), ends(once_id)), (1, 0));
    let get = |id| {
        let q = q.clone();
        async move {
            match q.get(id).await.unwrap() {
                TaskEntry::Task(t) => t,
                other => panic!("{other:?}"),
            }
        }
    };
    let t = get(again_id).await;
    assert_eq!((t.state, t.attempts), (TaskState::Succeeded, 2));
    let t = get(once_id).await;
    assert_eq!(t.state, TaskState::Failed);
    assert!(t.detail.unwrap().contains("at-most-once"));
    for e in &ids[2..] {
        assert_eq!((starts(e.id), ends(e.id)), (1, 1), "task {}", e.id);
        assert_eq!(get(e.id).await.state, TaskState::Succeeded);
    }
}

fn run(s: &Setup, args: &[&str]) -> (i32, String, String) {
    let out = s.cmd().args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_input_is_a_clear_error_and_the_worker_goes_on() {
    bad_input(Setup::new());
}

#[test]
fn postgres_bad_input_is_a_clear_error_and_the_worker_goes_on() {
    bad_input(Setup::postgres());
}

fn bad_input(s: Setup) {
    let (code, _, err) = run(
        &s,
        &[
            "queue",
            "add",
            "--key",
            "a",
            "--priority",
            "urgent",
            "--",
            "true",
        ],
    );
    assert_eq!(code, 2);
    assert!(err.contains("not a priority"), "{err}");
    let (code, _, err) = run(&s, &["queue", "cancel", "12345"]);
    assert_eq!(code, 1);
    assert!(err.contains("task 12345 not found"), "{err}");
    let (code, _, err) = run(&s, &["queue", "cancel", "x"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = run(&s, &["queue", "add", "--key", "", "--", "true"]);
    assert_eq!(code, 2, "{err}");
    let (code, out, _) = run(
        &s,
        &["queue", "add", "--key", "a", "--", "/no/such/program"],
    );
    assert_eq!(code, 0);
    assert!(out.contains("task 1 queued for a (position 1)"), "{out}");
    let (code, _, _) = run(&s, &["queue", "add", "--key", "a", "--", "true"]);
    assert_eq!(code, 0);
    let w = s.worker(0, &["--exit-when-idle"]);
    assert!(wait_for(w, Duration::from_secs(20)).success());
    let (_, out, _) = run(&s, &["queue", "ls", "--all", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["state"], "failed");
    assert!(v[0]["detail"]
        .as_str()
        .unwrap()
        .contains("cannot start \"/no/such/program\""));
    assert_eq!(v[1]["state"], "succeeded", "the worker went on");
    assert!(s.worker_errors().contains("/no/such/program"));
}

#[test]
fn a_running_task_is_cancelled_through_its_worker_and_timeouts_stop_tasks() {
    cancel_and_timeout(Setup::new());
}

#[test]
fn postgres_a_running_task_is_cancelled_through_its_worker_and_timeouts_stop_tasks() {
    cancel_and_timeout(Setup::postgres());
}

fn cancel_and_timeout(s: Setup) {
    let (code, _, _) = run(&s, &["queue", "add", "--key", "a", "--", "sleep", "30"]);
    assert_eq!(code, 0);
    let (code, _, _) = run(
        &s,
        &[
            "queue",
            "add",
            "--key",
            "b",
            "--timeout",
            "300ms",
            "--",
            "sleep",
            "30",
        ],
    );
    assert_eq!(code, 0);
    let w = s.worker(0, &["--exit-when-idle", "--grace", "1s"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, out, _) = run(&s, &["queue", "status", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        if v["leases"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["key"] == "a" && !l["fence"].is_null())
        {
            break;
        }
        assert!(Instant::now() < deadline, "task 1 never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (code, out, _) = run(&s, &["queue", "cancel", "1"]);
    assert_eq!(code, 0);
    assert!(out.contains("asked to stop"), "{out}");
    assert!(wait_for(w, Duration::from_secs(20)).success());
    let (_, out, _) = run(&s, &["queue", "ls", "--all", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["state"], "cancelled", "{v}");
    assert_eq!(v[1]["state"], "cancelled", "{v}");
    assert_eq!(v[1]["detail"], "timed out", "{v}");
    let (_, out, _) = run(&s, &["queue", "status"]);
    assert!(out.contains("2 cancelled"), "{out}");
}

#[test]
fn what_a_task_leaves_running_ends_with_it() {
    let s = Setup::new();
    let dir = s.dir.path().display().to_string();
    // Each task starts a daemon in a new session (out of the task's process group), writes its
    // pid, and then exits (a) or runs past its timeout (b).
    let daemon =
        |name: &str, then: &str| format!("setsid sleep 60 & echo $! > '{dir}/{name}.pid'; {then}");
    for (key, script, timeout) in [
        ("a", daemon("a", "true"), None),
        ("b", daemon("b", "sleep 30"), Some("300ms")),
        // The next task on a: is a's daemon still there?
        (
            "a",
            format!("if kill -0 \"$(cat '{dir}/a.pid')\" 2>/dev/null; then echo alive; else echo gone; fi > '{dir}/seen'"),
            None,
        ),
    ] {
        let mut args = vec!["queue", "add", "--key", key];
        if let Some(t) = timeout {
            args.extend(["--timeout", t]);
        }
        args.extend(["--", "sh", "-c", &script]);
        let (code, _, err) = run(&s, &args);
        assert_eq!(code, 0, "{err}");
    }
    let w = s.worker(0, &["--exit-when-idle", "--slots", "1", "--grace", "1s"]);
    assert!(
        wait_for(w, Duration::from_secs(20)).success(),
        "{}",
        s.worker_errors()
    );
    let seen = std::fs::read_to_string(s.dir.path().join("seen")).unwrap();
    assert_eq!(
        seen.trim(),
        "gone",
        "the next task on a ran beside a's daemon"
    );
    for name in ["a", "b"] {
        let pid = std::fs::read_to_string(s.dir.path().join(format!("{name}.pid"))).unwrap();
        let proc_dir = PathBuf::from(format!("/proc/{}", pid.trim()));
        assert!(!proc_dir.exists(), "{name}'s daemon outlived its task");
    }
    let (_, out, _) = run(&s, &["queue", "ls", "--all", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["state"], "succeeded", "{v}");
    assert_eq!(v[1]["detail"], "timed out", "{v}");
    assert_eq!(v[2]["state"], "succeeded", "{v}");
}

/// A worker killed with SIGKILL takes its task with it — the command, its process group and a
/// daemon it started in a new session — so a rerun of the task never runs beside them.
#[test]
fn a_killed_worker_s_task_leaves_nothing_running() {
    let s = Setup::new();
    let dir = s.dir.path().display().to_string();
    let script = format!(
        "setsid sleep 60 & echo $! > '{dir}/daemon.pid'; sleep 60 & echo $! > '{dir}/child.pid'; \
         echo $$ > '{dir}/task.pid'; wait"
    );
    let (code, _, err) = run(
        &s,
        &["queue", "add", "--key", "a", "--", "sh", "-c", &script],
    );
    assert_eq!(code, 0, "{err}");
    let w = s.worker(0, &[]);
    await_pid_file(&s, "task");
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(w.id() as i32, libc::SIGKILL) };
    wait_for(w, Duration::from_secs(20));
    for name in ["task", "child", "daemon"] {
        let pid = await_pid_file(&s, name);
        let deadline = Instant::now() + Duration::from_secs(10);
        while PathBuf::from(format!("/proc/{pid}")).exists()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
                st.rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
            })
        {
            assert!(
                Instant::now() < deadline,
                "the task's {name} (pid {pid}) outlived its killed worker"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A task's supervisor killed with SIGKILL (the OOM killer, the worker's last resort) dies before
/// its own sweep; what the task started in a new session is re-parented to the worker, which
/// kills it before it records the task's end.
#[test]
fn a_killed_supervisor_s_task_leaves_nothing_running() {
    let s = Setup::new();
    let dir = s.dir.path().display().to_string();
    let script =
        format!("setsid sleep 60 & echo $! > '{dir}/daemon.pid'; echo $$ > '{dir}/task.pid'; wait");
    let (code, _, err) = run(
        &s,
        &["queue", "add", "--key", "a", "--", "sh", "-c", &script],
    );
    assert_eq!(code, 0, "{err}");
    let w = s.worker(0, &["--exit-when-idle"]);
    let task = await_pid_file(&s, "task");
    let daemon = await_pid_file(&s, "daemon");
    let stat = std::fs::read_to_string(format!("/proc/{task}/stat")).unwrap();
    let supervisor: i32 = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok())
        .unwrap();
    // SAFETY: kill(2) on the supervisor, a grandchild of ours that is running.
    unsafe { libc::kill(supervisor, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, out, _) = run(&s, &["queue", "ls", "--all", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        if v[0]["state"] == "failed" {
            assert_eq!(v[0]["detail"], "killed by SIGKILL", "{v}");
            break;
        }
        assert!(Instant::now() < deadline, "the task never ended: {v}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !PathBuf::from(format!("/proc/{daemon}")).exists(),
        "the task's daemon outlived its killed supervisor"
    );
    assert!(
        wait_for(w, Duration::from_secs(20)).success(),
        "{}",
        s.worker_errors()
    );
}

/// The pid the task writes to `NAME.pid` in the temp dir, once it has.
fn await_pid_file(s: &Setup, name: &str) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pid = std::fs::read_to_string(s.dir.path().join(format!("{name}.pid")))
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok());
        if let Some(pid) = pid {
            return pid;
        }
        assert!(Instant::now() < deadline, "the task never wrote {name}.pid");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `queue work --metrics ADDR` serves the queue's depth and this worker's work and leases in the
/// Prometheus text format.
#[test]
fn a_worker_serves_its_metrics() {
    let s = Setup::new();
    let add = |args: &[&str]| {
        let mut all = vec!["queue", "add"];
        all.extend_from_slice(args);
        let (code, _, err) = run(&s, &all);
        assert_eq!(code, 0, "{err}");
    };
    add(&["--key", "a", "--", "true"]);
    add(&["--key", "a", "--", "false"]);
    add(&["--key", "b", "--timeout", "300ms", "--", "sleep", "30"]);
    let port = leasehold_testkit::servers::free_port();
    let addr = format!("127.0.0.1:{port}");
    let w = s.worker(
        0,
        &[
            "--slots",
            "1",
            "--grace",
            "1s",
            "--drain-timeout",
            "100ms",
            "--metrics",
            &addr,
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let await_states = |want: &[&str]| loop {
        let (_, out, _) = run(&s, &["queue", "ls", "--all", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let states: Vec<&str> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["state"].as_str().unwrap_or_default())
            .collect();
        if states == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "states {states:?}, waiting for {want:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    await_states(&["succeeded", "failed", "cancelled"]);
    // One task runs in the only slot, two wait behind it.
    add(&["--key", "z", "--", "sleep", "30"]);
    await_states(&["succeeded", "failed", "cancelled", "running"]);
    add(&["--key", "y", "--", "true"]);
    add(&["--key", "x", "--priority", "high", "--", "true"]);

    let (code, text) = leasehold_testkit::servers::http_get(port, "/metrics").unwrap();
    assert_eq!(code, 200, "{text}");
    for line in [
        "leasehold_queue_running 1",
        "leasehold_queue_slots 1",
        "leasehold_queue_workers 1",
        "leasehold_queue_pending{priority=\"high\"} 1",
        "leasehold_queue_pending{priority=\"normal\"} 1",
        "leasehold_queue_pending{priority=\"low\"} 0",
        "leasehold_queue_tasks_started_total 4",
        "leasehold_queue_tasks_finished_total{outcome=\"succeeded\"} 1",
        "leasehold_queue_tasks_finished_total{outcome=\"failed\"} 1",
        "leasehold_queue_tasks_finished_total{outcome=\"cancelled\"} 1",
        "leasehold_queue_task_run_seconds_count 3",
        "leasehold_queue_task_wait_seconds_count 4",
        // The four tasks' key leases and the worker's name lease.
        "leasehold_acquire_success_total 5",
        "leasehold_releases_total 3",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
    let (code, _) = leasehold_testkit::servers::http_get(port, "/").unwrap();
    assert_eq!(code, 404);
    let (code, _) =
        leasehold_testkit::servers::http_request(port, "POST", "/metrics", &[], "").unwrap();
    assert_eq!(code, 405);

    // SIGTERM drains: the running task is stopped after the drain timeout, the worker exits 0.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(w.id() as i32, libc::SIGTERM) };
    assert!(
        wait_for(w, Duration::from_secs(20)).success(),
        "{}",
        s.worker_errors()
    );
}

/// A task another worker recovered (its worker paused past its claim) is counted where it was
/// recovered, not also as finished by the worker that ran it: a sum over the workers stays the
/// queue's.
#[test]
fn a_task_recovered_elsewhere_is_not_counted_finished_by_its_first_worker() {
    let s = Setup::new();
    let (code, _, err) = run(&s, &["queue", "add", "--key", "k", "--", "sleep", "2"]);
    assert_eq!(code, 0, "{err}");
    let port = leasehold_testkit::servers::free_port();
    let addr = format!("127.0.0.1:{port}");
    let a = s.worker(0, &["--slots", "1", "--metrics", &addr]);
    let task = |s: &Setup| -> serde_json::Value {
        let (code, out, err) = run(s, &["queue", "ls", "--all", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("queue ls: {e} (exit {code}): {out:?} {err:?}"));
        v[0].clone()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let until = |what: &str, done: &dyn Fn(&serde_json::Value) -> bool| loop {
        let t = task(&s);
        if done(&t) {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {t}\n{}",
            s.worker_errors()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let started = until("never started", &|t| t["state"] == "running");
    // Paused past its claim's TTL (1 s): the second worker recovers the task.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(a.id() as i32, libc::SIGSTOP) };
    let b = s.worker(1, &["--slots", "1"]);
    let recovered = |t: &serde_json::Value| {
        t["state"] != "running"
            || t["attempts"] != started["attempts"]
            || t["worker"] != started["worker"]
    };
    // Paused inside a write transaction (rarely: they last milliseconds), the first worker holds
    // SQLite's write lock and nobody can recover anything: it is resumed for a moment and paused
    // again.
    let mut pauses = 1;
    let mut next_pause = Instant::now() + Duration::from_secs(5);
    loop {
        let t = task(&s);
        if recovered(&t) {
            break;
        }
        if Instant::now() >= next_pause {
            assert!(pauses < 4, "not recovered: {t}\n{}", s.worker_errors());
            // SAFETY: as above.
            unsafe { libc::kill(a.id() as i32, libc::SIGCONT) };
            // Time for it to finish its transaction: there is nothing to await.
            std::thread::sleep(Duration::from_millis(50));
            // SAFETY: as above.
            unsafe { libc::kill(a.id() as i32, libc::SIGSTOP) };
            pauses += 1;
            next_pause = Instant::now() + Duration::from_secs(5);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: as above.
    unsafe { libc::kill(a.id() as i32, libc::SIGCONT) };
    let errors = Instant::now() + Duration::from_secs(20);
    while !s.worker_errors().contains("recovered by another worker") {
        assert!(Instant::now() < errors, "{}", s.worker_errors());
        std::thread::sleep(Duration::from_millis(20));
    }
    let (code, text) = leasehold_testkit::servers::http_get(port, "/metrics")
        .unwrap_or_else(|| panic!("no metrics: {}", s.worker_errors()));
    assert_eq!(code, 200, "{text}");
    assert!(
        text.contains("leasehold_queue_tasks_started_total 1"),
        "{text}"
    );
    assert!(
        !text.contains("leasehold_queue_tasks_finished_total{"),
        "counted as finished here too:\n{text}"
    );
    for w in [a, b] {
        // SAFETY: as above.
        unsafe { libc::kill(w.id() as i32, libc::SIGTERM) };
        assert!(
            wait_for(w, Duration::from_secs(20)).success(),
            "{}",
            s.worker_errors()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_of_100k_pending_tasks_answers_under_a_second() {
    status_of_100k(Setup::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_status_of_100k_pending_tasks_answers_under_a_second() {
    status_of_100k(Setup::postgres()).await;
}

async fn status_of_100k(s: Setup) {
    let q = s.open().await;
    let tasks: Vec<NewTask> = (0..100_000)
        .map(|i| NewTask::new(format!("user{}", i % 1000), "{\"argv\":[\"true\"]}"))
        .collect();
    q.enqueue_batch(&tasks).await.unwrap();
    let started = Instant::now();
    let (code, out, err) = run(&s, &["queue", "status", "--json"]);
    let took = started.elapsed();
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["pending"]["normal"], 100_000);
    assert_eq!(v["keys_total"], 1000);
    assert!(took < Duration::from_secs(1), "status took {took:?}");
    let started = Instant::now();
    let (code, out, _) = run(&s, &["queue", "status"]);
    assert_eq!(code, 0);
    assert!(out.contains("… and 900 more keys"), "{out}");
    assert!(started.elapsed() < Duration::from_secs(1));
    // Dispatch stays fast: claims with 100,000 pending.
    let started = Instant::now();
    let req = leasehold::queue::ClaimRequest {
        worker: "w".into(),
        max_running: 100,
        group_limit: None,
        ttl: Duration::from_secs(2),
    };
    for _ in 0..20 {
        assert!(q.claim(&req).await.unwrap().is_some());
    }
    let per = started.elapsed() / 20;
    assert!(per < Duration::from_millis(100), "a claim took {per:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_deletes_ended_tasks_only() {
    cleanup(Setup::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_cleanup_deletes_ended_tasks_only() {
    cleanup(Setup::postgres()).await;
}

/// `queue cleanup`: ended tasks older than `--older-than` go, pending ones stay; a bad duration
/// is a usage error.
async fn cleanup(s: Setup) {
    let q = s.open().await;
    let req = leasehold_testkit::queue_suite::claim_req("w", 4);
    q.enqueue(&NewTask::new("a", "{\"argv\":[\"true\"]}"))
        .await
        .unwrap();
    let done = q.claim(&req).await.unwrap().unwrap();
    assert!(q
        .finish(done.id, "w", &leasehold::queue::Outcome::Succeeded)
        .await
        .unwrap());
    let waiting = q
        .enqueue(&NewTask::new("a", "{\"argv\":[\"true\"]}"))
        .await
        .unwrap()
        .id;
    let (code, out, err) = run(&s, &["queue", "cleanup", "--older-than", "1h"]);
    assert_eq!(
        (code, out.as_str()),
        (0, "deleted 0 tasks that ended at least 1h ago\n"),
        "{err}"
    );
    let (code, out, err) = run(&s, &["queue", "cleanup", "--older-than", "0s", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["deleted"], 1);
    let left: Vec<u64> = q
        .list(true, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|e| match e {
            TaskEntry::Task(t) => t.id,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(left, [waiting]);
    let (code, _, err) = run(&s, &["queue", "cleanup", "--older-than", "soon"]);
    assert_eq!(code, 2, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_cleanup_after_deletes_ended_tasks() {
    worker_cleanup(Setup::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_worker_with_cleanup_after_deletes_ended_tasks() {
    worker_cleanup(Setup::postgres()).await;
}

/// `queue work --cleanup-after 0s`: the task the worker ran is deleted once it ended (at the
/// worker's next cleanup, a second apart at most), after it ran.
async fn worker_cleanup(s: Setup) {
    let q = s.open().await;
    let id = q.enqueue(&NewTask::new("a", s.task(0))).await.unwrap().id;
    let _w = s.worker(0, &["--cleanup-after", "0s"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !matches!(q.get(id).await, Err(leasehold::Error::NotFound { .. })) {
        assert!(Instant::now() < deadline, "{}", s.worker_errors());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ran: Vec<bool> = s.events().iter().map(|e| e.start).collect();
    assert_eq!(ran, [true, false], "it ran, start to end, before it went");
}

/// A task command that ignores SIGTERM and appends `$ME NANOS` to `$LOG` every 20 ms, forever.
const WRITER: &str = r#"trap '' TERM;
    while :; do echo "$ME $(date +%s%N)" >> "$LOG"; sleep 0.02 </dev/null >/dev/null 2>&1; done"#;

/// A command that appends `$ME NANOS` to `$LOG` every 20 ms, 25 times, and exits 0.
const SECOND_WRITER: &str = r#"i=0; while [ $i -lt 25 ]; do echo "$ME $(date +%s%N)" >> "$LOG";
    sleep 0.02 </dev/null >/dev/null 2>&1; i=$((i+1)); done"#;

/// `leasehold run` on key `k` of `store` (TTL 1 s, waiting for it) running [`SECOND_WRITER`] as
/// `B`, to its end.
fn second_writer(s: &Setup, store: &str, log: &Path) -> ExitStatus {
    let second = s
        .cmd()
        .args(["--store", store, "run", "--key", "k", "--ttl", "1s"])
        .args(["--wait", "60s", "--", "sh", "-c", SECOND_WRITER])
        .env("ME", "B")
        .env("LOG", log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(Worker(Some(second)), Duration::from_secs(60))
}

/// Waits (bounded) until `who` has written to `log`.
fn await_writer(s: &Setup, log: &Path, who: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.lines().any(|l| l.starts_with(who)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the task never ran: {}",
            s.worker_errors()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Asserts that the worker's task (`A`) wrote, then the other process (`B`), and never `A` after
/// `B` began.
fn assert_no_interleaving(log: &Path, s: &Setup) {
    let text = std::fs::read_to_string(log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let ms = |l: &str| {
        l.split_whitespace()
            .nth(1)
            .and_then(|t| t.parse::<u64>().ok())
            .unwrap_or(0)
            / 1_000_000
    };
    let first_b = lines
        .iter()
        .position(|l| l.starts_with("B "))
        .unwrap_or_else(|| panic!("the second process never wrote: {lines:?}"));
    let late: Vec<&&str> = lines[first_b..]
        .iter()
        .filter(|l| l.starts_with("A "))
        .collect();
    if let Some(last) = late.last() {
        panic!(
            "both tasks' commands ran: {} lines of the worker's task after the other began ({} ms of overlap)\n{}",
            late.len(),
            ms(last).saturating_sub(ms(lines[first_b])),
            s.worker_errors()
        );
    }
}

/// A worker cut off from the lock store (Redis through a proxy that stops forwarding; its SQLite
/// queue stays reachable) has its task — which ignores SIGTERM — gone before the key's lease can
/// expire: a `leasehold run` on the same key, reaching Redis directly, is granted the lease at
/// its expiry, and the two commands never write at the same time. Before, the task was told to
/// stop only at `lost()` and killed `--grace` (10 s) later, while the other process ran.
#[test]
fn a_worker_cut_off_from_the_store_stops_its_task_before_another_is_granted_the_key() {
    use leasehold_testkit::{proxy::TcpProxy, servers::RedisServer};
    let redis = RedisServer::start();
    let proxy = TcpProxy::start(redis.port);
    let via_proxy = format!("redis://127.0.0.1:{}/0", proxy.port);
    let s = Setup::new();
    let log = s.dir.path().join("writers.log");
    let (code, _, err) = run(
        &s,
        &["queue", "add", "--key", "k", "--", "sh", "-c", WRITER],
    );
    assert_eq!(code, 0, "{err}");
    let mut cmd = s.cmd();
    cmd.env("LEASEHOLD_STORE", &via_proxy)
        .env("ME", "A")
        .env("LOG", &log);
    let worker = s.worker_with(0, &["--slots", "1"], cmd);
    await_writer(&s, &log, "A ");
    proxy.pause();
    let status = second_writer(&s, &redis.url(), &log);
    assert!(status.success(), "{status:?}");
    assert_no_interleaving(&log, &s);
    // The task ended as one whose lease failed.
    let (_, out, _) = run(&s, &["queue", "ls", "--all", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["state"], "failed", "{v}");
    assert!(
        v[0]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("lease was lost")),
        "{v}"
    );
    proxy.resume();
    drop(worker);
}

/// A worker that is paused (SIGSTOP) cannot stop its task when the key's lease runs out: the
/// task's supervisor, told each of the lease's deadlines, has the command's group killed at the
/// deadline, before a `leasehold run` on the same key is granted the lease at its expiry.
#[test]
fn a_paused_worker_s_task_is_killed_before_another_is_granted_the_key() {
    let s = Setup::new();
    let log = s.dir.path().join("writers.log");
    let (code, _, err) = run(
        &s,
        &["queue", "add", "--key", "k", "--", "sh", "-c", WRITER],
    );
    assert_eq!(code, 0, "{err}");
    let mut cmd = s.cmd();
    cmd.env("ME", "A").env("LOG", &log);
    let worker = s.worker_with(0, &["--slots", "1"], cmd);
    await_writer(&s, &log, "A ");
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(worker.id() as i32, libc::SIGSTOP) };
    let status = second_writer(&s, &s.store, &log);
    // SAFETY: as above.
    unsafe { libc::kill(worker.id() as i32, libc::SIGCONT) };
    assert!(status.success(), "{status:?}");
    assert_no_interleaving(&log, &s);
    // The task ended as one whose lease ran out.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, out, _) = run(&s, &["queue", "ls", "--all", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        if v[0]["state"] != "running" {
            assert_eq!(v[0]["state"], "failed", "{v}");
            let detail = v[0]["detail"].as_str().unwrap_or_default();
            assert!(detail.contains("lease was lost"), "{v}");
            break;
        }
        assert!(Instant::now() < deadline, "the task did not end: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(worker);
}

/// A task whose key's lease the store says is gone (force-released) is killed at once: no
/// SIGTERM first (the task would log it), and the task fails naming why.
#[test]
fn a_task_whose_lease_is_force_released_is_killed_at_once() {
    let s = Setup::new();
    let log = s.dir.path().join("writers.log");
    let task = r#"trap 'echo "TERM $(date +%s%N)" >> "$LOG"' TERM;
        while :; do echo "A $(date +%s%N)" >> "$LOG"; sleep 0.02 </dev/null >/dev/null 2>&1; done"#;
    let (code, _, err) = run(&s, &["queue", "add", "--key", "k", "--", "sh", "-c", task]);
    assert_eq!(code, 0, "{err}");
    let mut cmd = s.cmd();
    cmd.env("LOG", &log);
    // A 3 s TTL: a renewal slowed by a loaded machine does not reach the stop-by deadline (as
    // it can at 1 s), so the only stop is the release the next renewal finds.
    let worker = s.worker_with(0, &["--slots", "1", "--ttl", "3s"], cmd);
    await_writer(&s, &log, "A ");
    let (code, _, err) = run(&s, &["release", "--force", "k"]);
    assert_eq!(code, 0, "{err}");
    let released = Instant::now();
    let deadline = released + Duration::from_secs(20);
    let v = loop {
        let (_, out, _) = run(&s, &["queue", "ls", "--all", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        if v[0]["state"] != "running" {
            break v;
        }
        assert!(Instant::now() < deadline, "the task did not end: {v}");
        std::thread::sleep(Duration::from_millis(20));
    };
    // Learned at the next renewal (TTL/3 of 3 s), then killed at once.
    assert!(
        released.elapsed() < Duration::from_secs(3),
        "the task ran {:?} after its lease was force-released",
        released.elapsed()
    );
    assert_eq!(v[0]["state"], "failed", "{v}");
    let detail = v[0]["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("released by someone else"), "{v}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.lines().any(|l| l.starts_with("TERM ")),
        "the task got SIGTERM: {text}"
    );
    drop(worker);
}

/// A worker of a PostgreSQL queue without `--store` takes its key leases from the queue's
/// database: the lease table there has the task's key, released, with the fence the task ran
/// under.
#[tokio::test]
async fn a_postgres_queue_without_store_leases_keys_in_its_database() {
    let s = Setup::postgres();
    let q = s.open().await;
    q.enqueue(&NewTask::new("report/7", s.task(0)))
        .await
        .unwrap();
    let mut cmd = s.cmd();
    cmd.env_remove("LEASEHOLD_STORE");
    let w = s.worker_with(0, &["--slots", "1", "--exit-when-idle"], cmd);
    assert!(
        wait_for(w, Duration::from_secs(20)).success(),
        "{}",
        s.worker_errors()
    );
    let ev = s.events();
    assert_eq!(ev.len(), 2, "{ev:?}");
    let db = s.queue.rsplit('/').next().unwrap();
    let row = leasehold_testkit::servers::shared_postgres().psql(
        db,
        "SELECT fence, token IS NULL FROM leasehold_leases WHERE key = 'report/7'",
    );
    assert_eq!(row, Some(format!("{}|t", ev[0].fence)), "{ev:?}");
}
