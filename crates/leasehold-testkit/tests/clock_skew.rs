//! Clock skew, with real processes whose wall clocks `faketime` moves minutes ahead and minutes
//! behind (their monotonic and boot-time clocks left alone). On Kubernetes Leases
//! (leasehold-apiserver over a real etcd): a held lease is never granted early, a crashed holder's
//! lease is taken over within its TTL plus one observation, and fences never go backwards, not even
//! after `kubectl delete lease` when the next pod's clock lags. On the file store, whose processes
//! share the host's boot-time clock: a wall clock set ahead or behind changes nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold_testkit::servers::{http_request, shared_apiserver, ApiServer};
use leasehold_testkit::workspace_bin;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const NS: &str = "clock";
const AHEAD: &str = "+120s";
const BEHIND: &str = "-120s";
const TTL_MS: u64 = 1000;

/// A line a worker printed, with the worker's name.
type Line = (String, String);

/// A worker process and the lines it prints, as they come.
struct Worker {
    child: Child,
    lines: mpsc::Receiver<Line>,
    name: String,
}

impl Worker {
    /// Starts `leasehold-worker ARGS`, with its wall clock moved by `offset` (`faketime` syntax)
    /// when given.
    fn start(offset: Option<&str>, args: &[&str]) -> Worker {
        let (tx, lines) = mpsc::channel();
        let (child, name) = Self::spawn(offset, args, tx);
        Worker { child, lines, name }
    }

    /// Starts a worker whose lines go to `tx`; the child and its name.
    fn spawn(offset: Option<&str>, args: &[&str], tx: mpsc::Sender<Line>) -> (Child, String) {
        let worker = workspace_bin("leasehold-worker");
        let mut c = match offset {
            // libfaketime preloaded directly: the `faketime` wrapper names a semaphore after its
            // pid, which a wrapper killed by SIGKILL leaves behind, and a later wrapper given the
            // same pid then fails to start ("sem_open: File exists").
            Some(o) => {
                leasehold_testkit::sweep_faketime_leftovers();
                let mut c = Command::new(&worker);
                c.env("LD_PRELOAD", leasehold_testkit::libfaketime())
                    .env("FAKETIME", o)
                    .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                    .env("FAKETIME_NO_CACHE", "1");
                c
            }
            None => Command::new(&worker),
        };
        // A group of its own, killed together.
        let mut child = c
            .args(args)
            .process_group(0)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start {worker:?} (under faketime {offset:?}; apt-get install faketime): {e}")
            });
        let out = child.stdout.take().unwrap();
        let name = format!("{} (clock {})", args[0], offset.unwrap_or("+0s"));
        let who = name.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send((who.clone(), line)).is_err() {
                    return;
                }
            }
        });
        (child, name)
    }

    /// The next line within `limit`, if any.
    fn line(&self, limit: Duration) -> Option<String> {
        self.lines.recv_timeout(limit).ok().map(|(_, l)| l)
    }

    /// A line already printed, without waiting.
    fn printed(&self) -> Option<String> {
        self.lines.try_recv().ok().map(|(_, l)| l)
    }
}

/// Processes started with [`Worker::spawn`], killed when dropped.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            kill(c);
        }
    }
}

/// Kills `child` and everything in its process group (a worker under `faketime`).
fn kill(child: &mut Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: a signal to the process group this test started (its leader is `child`).
        unsafe { libc::kill(-pid, libc::SIGKILL) };
    }
    let _ = child.wait();
}

impl Drop for Worker {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

/// Runs `leasehold-worker try` once with the clock moved by `offset`: `Some(fence)` when granted,
/// `None` when busy.
fn try_once(url: &str, key: &str, offset: Option<&str>) -> Option<u64> {
    let w = Worker::start(offset, &["try", url, key, &TTL_MS.to_string()]);
    let line = w
        .line(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("{} answered nothing", w.name));
    match line.split_once(' ') {
        Some(("granted", f)) => Some(f.parse().unwrap()),
        Some(("busy", _)) | None if line.starts_with("busy") => None,
        _ => panic!("{}: unexpected {line:?}", w.name),
    }
}

/// The fence a `hold` worker printed (`held FENCE`).
fn held_fence(line: &str) -> u64 {
    line.strip_prefix("held ")
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("expected `held FENCE`, got {line:?}"))
}

/// The `leasehold.io/` annotations of `key`'s Lease, read with the API.
fn lease_annotations(s: &ApiServer, key: &str) -> Option<Value> {
    let path = format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases");
    let (code, body) = http_request(s.port, "GET", &path, &[], "").unwrap();
    assert_eq!(code, 200, "{body}");
    let list: Value = serde_json::from_str(&body).unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["metadata"]["annotations"]["leasehold.io/key"] == key)
        .map(|l| l["metadata"]["annotations"].clone())
}

/// Awaits `key`'s Lease annotations satisfying `ok` (looked at every 20 ms, for at most 20 s).
fn until_lease(s: &ApiServer, key: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let give_up = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(a) = lease_annotations(s, key).filter(|a| ok(a)) {
            return a;
        }
        assert!(
            Instant::now() < give_up,
            "{key}: not {what} after 20 s: {:?}",
            lease_annotations(s, key)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `sig` to the process group of `child`.
fn signal(child: &Child, sig: i32) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: a signal to the process group this test started (its leader is `child`).
        unsafe { libc::kill(-pid, sig) };
    }
}

/// The release is the grant: the holder's release hands the lease to the first in line, a waiter
/// whose clock is two minutes ahead and which is paused (SIGSTOP) before it can claim it. The
/// grant lasts only what was left of its place (judged by observation, not by its clock): the
/// next waiter, two minutes behind, gets the lease within the place's lifetime plus one
/// observation, fenced above the grant; the paused waiter, continued, does not take it back.
#[test]
fn a_paused_waiter_ahead_in_time_keeps_its_grant_only_for_its_place() {
    let s = shared_apiserver();
    let url = s.store_url(NS);
    let key = "skew/granted-paused";
    let ttl = TTL_MS.to_string();
    let mut holder = Worker::start(None, &["hold", &url, key, &ttl]);
    held_fence(&holder.line(Duration::from_secs(20)).expect("holder"));
    let (tx, printed) = mpsc::channel();
    let (paused, _) = Worker::spawn(Some(AHEAD), &["hold", &url, key, &ttl], tx.clone());
    let paused = Children(vec![paused]);
    until_lease(s, key, "waited for", |a| {
        a["leasehold.io/waiter-token"].is_string()
    });
    let (next, _) = Worker::spawn(Some(BEHIND), &["hold", &url, key, &ttl], tx);
    let _next = Children(vec![next]);
    until_lease(s, key, "queued for", |a| {
        a["leasehold.io/queue"]
            .as_str()
            .is_some_and(|q| q.contains("token"))
    });
    signal(&paused.0[0], libc::SIGSTOP);
    signal(&holder.child, libc::SIGTERM);
    assert_eq!(
        holder.child.wait().unwrap().code(),
        Some(0),
        "the holder's exit"
    );
    let released = Instant::now();
    let granted = until_lease(s, key, "granted", |a| a["leasehold.io/unclaimed"] == "true");
    let grant_fence: u64 = granted["leasehold.io/fence"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    // The place's lifetime (the TTL here), one observation (TTL + 1 % + 2 ms), the waiter's
    // next look (at most 500 ms apart) and a moment to print.
    let limit = Duration::from_millis(TTL_MS + TTL_MS + TTL_MS / 100 + 2 + 500 + 700);
    let (taker, line) = printed
        .recv_timeout(limit)
        .unwrap_or_else(|_| panic!("nobody took the unclaimed grant's lease within {limit:?}"));
    assert!(taker.contains(BEHIND), "{taker} printed {line:?}");
    let fence = held_fence(&line);
    assert!(
        fence > grant_fence,
        "fence {fence} after the grant's {grant_fence}"
    );
    eprintln!("taken {:?} after the release", released.elapsed());
    // Continued, the paused waiter finds the lease held and waits.
    signal(&paused.0[0], libc::SIGCONT);
    if let Ok((who, line)) = printed.recv_timeout(Duration::from_millis(2 * TTL_MS)) {
        panic!("{who} printed {line:?} while the lagging waiter holds the lease");
    }
}

/// Deletes the Lease of `key` with the API, as `kubectl delete lease` does.
fn delete_lease(s: &ApiServer, key: &str) {
    let path = format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases");
    let (code, body) = http_request(s.port, "GET", &path, &[], "").unwrap();
    assert_eq!(code, 200, "{body}");
    let list: Value = serde_json::from_str(&body).unwrap();
    let name = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["metadata"]["annotations"]["leasehold.io/key"] == key)
        .and_then(|l| l["metadata"]["name"].as_str())
        .unwrap_or_else(|| panic!("no Lease for {key} in {list}"))
        .to_owned();
    let (code, body) = http_request(s.port, "DELETE", &format!("{path}/{name}"), &[], "").unwrap();
    assert_eq!(code, 200, "{body}");
}

/// One-shot contenders two minutes ahead and two minutes behind, started one after another for
/// two TTLs while a holder renews: every one of them is told the lease is held.
#[test]
fn a_renewed_lease_is_never_granted_to_a_contender_whose_clock_is_minutes_off() {
    let s = shared_apiserver();
    let url = s.store_url(NS);
    let key = "skew/held";
    let holder = Worker::start(None, &["hold", &url, key, &TTL_MS.to_string()]);
    let first = held_fence(&holder.line(Duration::from_secs(20)).expect("holder"));
    let until = Instant::now() + Duration::from_millis(2 * TTL_MS);
    let mut attempts = 0;
    while Instant::now() < until {
        for offset in [AHEAD, BEHIND] {
            attempts += 1;
            if let Some(fence) = try_once(&url, key, Some(offset)) {
                panic!(
                    "a contender whose clock is {offset} was granted the lease (fence {fence}) \
                     while its holder (fence {first}) renews it"
                );
            }
        }
    }
    assert!(attempts >= 4, "only {attempts} attempts in two TTLs");
    assert_eq!(holder.printed(), None, "the holder lost its lease");
}

/// A holder crashes (SIGKILL) while two waiters, two minutes ahead and two minutes behind, watch
/// its lease. Neither gets it while the holder lives; one gets it within the TTL plus one
/// observation of the crash, with a higher fence.
#[test]
fn a_crashed_holders_lease_goes_to_a_skewed_waiter_within_its_ttl() {
    let s = shared_apiserver();
    let url = s.store_url(NS);
    let key = "skew/crash";
    let ttl = TTL_MS.to_string();
    let mut holder = Worker::start(None, &["hold", &url, key, &ttl]);
    let first = held_fence(&holder.line(Duration::from_secs(20)).expect("holder"));
    let (tx, printed) = mpsc::channel();
    let _waiters = Children(vec![
        Worker::spawn(Some(AHEAD), &["hold", &url, key, &ttl], tx.clone()).0,
        Worker::spawn(Some(BEHIND), &["hold", &url, key, &ttl], tx).0,
    ]);
    // Two TTLs of the holder renewing: the waiters must still be waiting.
    if let Ok((who, line)) = printed.recv_timeout(Duration::from_millis(2 * TTL_MS)) {
        panic!("{who} printed {line:?} while the holder renews");
    }
    assert_eq!(holder.printed(), None, "the holder lost its lease");
    kill(&mut holder.child);
    let killed = Instant::now();
    // Observation ends TTL + 1 % + 2 ms after the last renewal seen; waiters poll at most 500 ms
    // apart once nothing changes, and a process needs a moment to print.
    let limit = Duration::from_millis(TTL_MS + TTL_MS / 100 + 2 + 500 + 700);
    let (taker, line) = printed
        .recv_timeout(limit)
        .unwrap_or_else(|_| panic!("no waiter took the crashed holder's lease within {limit:?}"));
    let took = killed.elapsed();
    let fence = held_fence(&line);
    assert!(fence > first, "{taker}: fence {fence} after {first}");
    eprintln!("{taker} took the lease {took:?} after the holder was killed");
}

/// The Lease is deleted with the API (`kubectl delete lease`) after a pod whose clock is two
/// minutes ahead held it, and the next pod's clock lags two minutes: its fence is still higher.
/// And again with the clocks the other way round.
#[test]
fn fences_never_go_backwards_after_kubectl_delete_when_the_next_pod_lags() {
    let s = shared_apiserver();
    let url = s.store_url(NS);
    let key = "skew/deleted";
    let mut last = 0;
    for offset in [Some(AHEAD), Some(BEHIND), None, Some(BEHIND)] {
        let fence = try_once(&url, key, offset).unwrap_or_else(|| panic!("{key} busy"));
        assert!(
            fence > last,
            "a pod whose clock is {offset:?} got fence {fence} after {last} (the Lease was deleted in between)"
        );
        last = fence;
        delete_lease(s, key);
    }
}

/// The file store: a contender whose wall clock is a minute ahead is told a held 10 s lease is
/// held, for as long as it is.
#[test]
fn file_store_a_contender_whose_clock_is_a_minute_ahead_is_told_the_lease_is_held() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let key = "skew/file-held";
    let holder = Worker::start(None, &["hold", &url, key, "10000"]);
    let first = held_fence(&holder.line(Duration::from_secs(20)).expect("holder"));
    for offset in ["+60s", "-60s", "+1h"] {
        let w = Worker::start(Some(offset), &["try", &url, key, "10000"]);
        let line = w
            .line(Duration::from_secs(20))
            .unwrap_or_else(|| panic!("{} answered nothing", w.name));
        assert!(
            line.starts_with("busy"),
            "a contender whose clock is {offset} got {line:?} while the holder (fence {first}) holds a 10 s lease"
        );
    }
    assert_eq!(holder.printed(), None, "the holder lost its lease");
}

/// The file store: a holder stopped with SIGSTOP keeps its kernel lock, so its lease ends by the
/// TTL; a waiter whose wall clock is a minute behind takes it over within the TTL, not a minute
/// later.
#[test]
fn file_store_a_stopped_holders_lease_goes_to_a_lagging_waiter_by_the_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let key = "skew/file-stopped";
    let ttl = TTL_MS.to_string();
    let holder = Worker::start(None, &["hold", &url, key, &ttl]);
    let first = held_fence(&holder.line(Duration::from_secs(20)).expect("holder"));
    let pid = i32::try_from(holder.child.id()).unwrap();
    // SAFETY: a signal to the process this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let stopped = Instant::now();
    let waiter = Worker::start(Some("-60s"), &["hold", &url, key, &ttl]);
    // TTL + the waiter's start and at most one 500 ms poll, well under the minute its clock lags.
    let limit = Duration::from_millis(TTL_MS + 500 + 1500);
    let line = waiter.line(limit).unwrap_or_else(|| {
        panic!(
            "{} did not take a stopped holder's lease within {limit:?}",
            waiter.name
        )
    });
    let fence = held_fence(&line);
    assert!(fence > first, "fence {fence} after {first}");
    eprintln!(
        "{} took the lease {:?} after the holder stopped",
        waiter.name,
        stopped.elapsed()
    );
}

/// The URLs of a fresh prefix on each object store the test kit starts (moto, Azurite,
/// fake-gcs-server), the processes' credentials set in this process's environment (children
/// inherit it).
fn object_store_urls(prefix: &str) -> Vec<(&'static str, String)> {
    static ENV: std::sync::Once = std::sync::Once::new();
    let moto = leasehold_testkit::s3_server::shared_moto();
    let azurite = leasehold_testkit::azure_server::shared_azurite();
    ENV.call_once(|| {
        for (k, v) in moto.env().into_iter().chain(azurite.env()) {
            std::env::set_var(k, v);
        }
    });
    let runtime = tokio::runtime::Runtime::new().unwrap();
    vec![
        ("s3", moto.url("clock-skew", prefix)),
        ("azure", runtime.block_on(azurite.url("clock-skew", prefix))),
        (
            "gcs",
            leasehold_testkit::gcs_server::shared_gcs().store_url(prefix),
        ),
    ]
}

/// On the object stores no client's wall clock decides: one-shot contenders an hour ahead and an
/// hour behind, started one after another for two TTLs while a holder renews, are every one told
/// the lease is held.
#[test]
fn object_stores_a_renewed_lease_is_never_granted_to_a_contender_an_hour_off() {
    for (store, url) in object_store_urls("held") {
        let key = "skew/object-held";
        let holder = Worker::start(None, &["hold", &url, key, &TTL_MS.to_string()]);
        let first = held_fence(&holder.line(Duration::from_secs(20)).expect("holder"));
        let until = Instant::now() + Duration::from_millis(2 * TTL_MS);
        let mut attempts = 0;
        while Instant::now() < until {
            for offset in ["+1h", "-1h"] {
                attempts += 1;
                if let Some(fence) = try_once(&url, key, Some(offset)) {
                    panic!(
                        "{store}: a contender whose clock is {offset} was granted the lease \
                         (fence {fence}) while its holder (fence {first}) renews it"
                    );
                }
            }
        }
        assert!(
            attempts >= 2,
            "{store}: only {attempts} attempts in two TTLs"
        );
        assert_eq!(holder.printed(), None, "{store}: the holder lost its lease");
    }
}

/// A holder killed with SIGKILL: a newcomer an hour behind, which has never seen the record,
/// takes the lease by the server's clock (the object's age by its `Date` and `Last-Modified`,
/// whole seconds) within the TTL and 3 s (and a second for the newcomers' processes to start),
/// not once its own clock passes the written expiry.
#[test]
fn object_stores_a_crashed_holders_lease_goes_to_a_lagging_newcomer_by_the_servers_clock() {
    for (store, url) in object_store_urls("crashed") {
        let key = "skew/object-crashed";
        let ttl = TTL_MS.to_string();
        let mut holder = Worker::start(None, &["hold", &url, key, &ttl]);
        let first = held_fence(&holder.line(Duration::from_secs(20)).expect("holder"));
        kill(&mut holder.child);
        let killed = Instant::now();
        let limit = Duration::from_millis(TTL_MS + 3000 + 1000);
        let fence = loop {
            if let Some(fence) = try_once(&url, key, Some("-1h")) {
                break fence;
            }
            assert!(
                killed.elapsed() < limit,
                "{store}: a newcomer an hour behind did not take a killed holder's lease within {limit:?}"
            );
        };
        let took = killed.elapsed();
        assert!(fence > first, "{store}: fence {fence} after {first}");
        assert!(
            took >= Duration::from_millis(TTL_MS / 2),
            "{store}: taken {took:?} after the kill: before its last renewal could have run out"
        );
        eprintln!("{store}: taken {took:?} after the holder was killed (TTL {TTL_MS} ms)");
    }
}

/// On the object stores, fences come from no client's clock once a record is deleted: processes
/// an hour ahead and an hour behind take and release a key in turn, and `cleanup` deletes its
/// record after each; every fence is above every earlier one (`cleanup` raised the store's fence
/// high-water mark first, and a record created again is fenced above it).
#[test]
fn object_stores_fences_never_go_backwards_after_cleanup_when_the_next_clock_lags() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    for (store, url) in object_store_urls("cleaned") {
        let key = "skew/object-cleaned";
        let locks = runtime.block_on(leasehold::open_store(&url)).unwrap();
        let mut last = 0;
        for offset in [Some("+1h"), Some("-1h"), None, Some("-1h")] {
            let fence =
                try_once(&url, key, offset).unwrap_or_else(|| panic!("{store}: {key} busy"));
            assert!(
                fence > last,
                "{store}: a process whose clock is {offset:?} got fence {fence} after {last} (cleanup deleted the record in between)"
            );
            last = fence;
            let report = runtime
                .block_on(locks.cleanup(Duration::ZERO, &leasehold::CleanupProgress::new()))
                .unwrap_or_else(|e| panic!("{store}: cleanup: {e}"));
            assert!(report.removed >= 1, "{store}: {report:?}");
        }
    }
}
