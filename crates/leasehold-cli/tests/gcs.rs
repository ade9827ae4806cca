//! `leasehold run --store gs://…` against `fake-gcs-server`, as separate processes: a run, the
//! single-waiter lock service's handoff (the holder is signalled, checkpoints and exits, the waiter runs
//! next; a second contender loses cleanly as contention), and a waiter that stops polling being
//! replaced once its registration lapses.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold_testkit::gcs_server::{shared_gcs, GcsServer};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

/// A `leasehold --store URL` command whose holder identity is `t/NAME`.
fn leasehold(url: &str, name: &str) -> Command {
    let mut c = Command::new(BIN);
    c.env_remove("LEASEHOLD_STORE")
        .env_remove("LEASEHOLD_LOG")
        .env("POD_NAMESPACE", "t")
        .env("POD_NAME", name)
        .args(["--store", url]);
    c
}

/// Children killed when the test ends, however it ends.
struct Kids(Vec<Child>);

impl Drop for Kids {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Spawns `cmd` with piped stdin and stdout, and waits for its first line if `ready`.
fn spawn(kids: &mut Kids, mut cmd: Command, ready: bool) -> usize {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if ready {
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready");
    }
    kids.0.push(child);
    kids.0.len() - 1
}

/// Waits (at most `limit`) until the lease object `name` satisfies `want`.
fn until(server: &GcsServer, name: &str, limit: Duration, want: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        let o = server
            .get_raw(name)
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .unwrap_or(Value::Null);
        if want(&o) {
            return o;
        }
        assert!(Instant::now() < deadline, "object {name}: {o}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits for child `i` to exit (at most `limit`): its code and output.
fn finish(kids: &mut Kids, i: usize, limit: Duration) -> (Option<i32>, String, String) {
    let deadline = Instant::now() + limit;
    let c = &mut kids.0[i];
    let status = loop {
        if let Some(s) = c.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "child {i} still runs");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    let mut err = String::new();
    use std::io::Read;
    if let Some(mut o) = c.stdout.take() {
        o.read_to_string(&mut out).unwrap();
    }
    if let Some(mut e) = c.stderr.take() {
        e.read_to_string(&mut err).unwrap();
    }
    (status.code(), out, err)
}

#[test]
fn run_works_on_gcs_objects_through_the_emulator_variable() {
    let server = shared_gcs();
    let prefix = leasehold_testkit::prefix("cli");
    // As Google's client libraries: STORAGE_EMULATOR_HOST=host:port, no credentials.
    let url = format!("gs://{}/{prefix}", leasehold_testkit::gcs_server::BUCKET);
    let run = |args: &[&str]| {
        leasehold(&url, "a")
            .env("STORAGE_EMULATOR_HOST", server.host())
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&[
        "run",
        "--key",
        "nightly",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_FENCE",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let fence: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(fence > 0);
    let o: Value =
        serde_json::from_str(&server.get_raw(&format!("{prefix}/nightly")).unwrap()).unwrap();
    assert_eq!(o["ownerId"], Value::Null, "released: {o}");
    assert_eq!(o["leasehold"]["fence"].as_u64(), Some(fence), "{o}");
    let out = run(&["inspect", "nightly", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let rec: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rec["fence"].as_u64(), Some(fence), "{rec}");
    let out = run(&["ls", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout)
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

const TRAP_USR1: &str =
    "trap 'echo got-USR1; exit 0' USR1; echo ready; while :; do sleep 0.05; done";

/// The single-waiter lock service's handoff with real processes: a holder checking for a waiter every 2 s (TTL 6 s,
/// renewed every TTL/3), a waiter, and a second contender that finds the waiter place taken.
#[test]
fn the_single_waiter_handoff_between_processes() {
    let server = shared_gcs();
    let prefix = leasehold_testkit::prefix("handoff");
    let url = server.store_url(&prefix);
    let name = format!("{prefix}/agent");
    let mut kids = Kids(vec![]);
    let mut a = leasehold(&url, "a");
    a.args([
        "run",
        "--key",
        "agent",
        "--ttl",
        "6s",
        "--on-handoff",
        "USR1",
        "--",
        "sh",
        "-c",
        TRAP_USR1,
    ]);
    let holder = spawn(&mut kids, a, true);
    let first = until(server, &name, Duration::from_secs(5), |o| {
        o["ownerId"] == "t/a"
    });
    let first_fence = first["leasehold"]["fence"].as_u64().unwrap();

    let t = Instant::now();
    let mut b = leasehold(&url, "b");
    b.args([
        "run",
        "--key",
        "agent",
        "--wait",
        "20s",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_FENCE",
    ]);
    let waiter = spawn(&mut kids, b, false);
    until(server, &name, Duration::from_secs(5), |o| {
        o["waitingOwnerId"] == "t/b"
    });

    // The waiter place is taken: a second contender waits as contention, not as an error, and
    // gives up at its limit (exit 75) without displacing the waiter.
    let out = leasehold(&url, "c")
        .args(["run", "--key", "agent", "--wait", "300ms", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("t/a") || said.contains("t/b"), "{said}");

    let (code, out, _) = finish(&mut kids, holder, Duration::from_secs(10));
    assert_eq!(code, Some(0));
    assert!(out.contains("got-USR1"), "{out}");
    let (code, out, err) = finish(&mut kids, waiter, Duration::from_secs(10));
    assert_eq!(code, Some(0), "{err}");
    let fence: u64 = out.trim().parse().unwrap();
    assert!(fence > first_fence);
    let took = t.elapsed();
    assert!(took < Duration::from_secs(8), "handoff took {took:?}");
    eprintln!("handoff in {took:?} (holder checks every 2 s)");
}

/// A waiter that stops polling (killed) keeps its place until its registration lapses; then the
/// next contender becomes the waiter and gets the lease when the holder is done.
#[test]
fn a_waiter_that_stops_polling_is_replaced() {
    let server = shared_gcs();
    let prefix = leasehold_testkit::prefix("lapse");
    let url = server.store_url(&prefix);
    let name = format!("{prefix}/agent");
    let mut kids = Kids(vec![]);
    let mut a = leasehold(&url, "a");
    a.args([
        "run",
        "--key",
        "agent",
        "--ttl",
        "3s",
        "--",
        "sh",
        "-c",
        "echo ready; read x",
    ]);
    let holder = spawn(&mut kids, a, true);
    let mut b = leasehold(&url, "b");
    b.args(["run", "--key", "agent", "--wait", "30s", "--", "true"]);
    let gone = spawn(&mut kids, b, false);
    until(server, &name, Duration::from_secs(5), |o| {
        o["waitingOwnerId"] == "t/b"
    });
    kids.0[gone].kill().unwrap();
    let _ = kids.0[gone].wait();

    let t = Instant::now();
    let mut c = leasehold(&url, "c");
    c.args([
        "run",
        "--key",
        "agent",
        "--wait",
        "30s",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_FENCE",
    ]);
    let next = spawn(&mut kids, c, false);
    until(server, &name, Duration::from_secs(15), |o| {
        o["waitingOwnerId"] == "t/c"
    });
    eprintln!("the lapsed waiter was replaced after {:?}", t.elapsed());
    kids.0[holder]
        .stdin
        .take()
        .unwrap()
        .write_all(b"done\n")
        .unwrap();
    let (code, _, _) = finish(&mut kids, holder, Duration::from_secs(10));
    assert_eq!(code, Some(0));
    let (code, out, err) = finish(&mut kids, next, Duration::from_secs(10));
    assert_eq!(code, Some(0), "{err}");
    assert!(out.trim().parse::<u64>().unwrap() > 0);
}

/// `leasehold run` beside the single-waiter GCS lock of the service leasehold replaces (its
/// design's Python client over the official `google-cloud-storage` package): `leasehold run`
/// processes as `t/NAME`, that client's processes as `agent-N`, one event log of who worked when.
mod lock_service_client {
    use super::*;
    use leasehold_testkit::foreign::{gcs_single_waiter_lock, EventLog, Proc};

    /// One key (`agent`) on the shared emulator, and the event log of who worked under it.
    struct Scene {
        server: &'static GcsServer,
        prefix: String,
        /// The object's name.
        name: String,
        log: EventLog,
    }

    impl Scene {
        fn new(tag: &str) -> Self {
            let prefix = leasehold_testkit::prefix(tag);
            Scene {
                server: shared_gcs(),
                name: format!("{prefix}/agent"),
                prefix,
                log: EventLog::new(),
            }
        }

        /// That service's process as `owner` (flags of `gcs_single_waiter_lock.py`).
        fn service(&self, owner: &str, ahead: Option<Duration>, args: &[&str]) -> Proc {
            gcs_single_waiter_lock(self.server, &self.name, owner, &self.log, ahead, args)
        }

        /// `leasehold --store URL&PARAMS run --key agent ARGS -- work.py` (logging as t/NAME).
        fn run(&self, params: &str, name: &str, args: &[&str], work: f64) -> Proc {
            let url = format!("{}{params}", self.server.store_url(&self.prefix));
            let mut c = leasehold(&url, name);
            c.args(["run", "--key", "agent"])
                .args(args)
                .arg("--")
                .args(self.log.worker(&format!("t/{name}"), work));
            Proc::spawn(c, &format!("leasehold run as t/{name}"))
        }

        /// The object as JSON.
        fn object(&self) -> Value {
            serde_json::from_str(&self.server.get_raw(&self.name).unwrap()).unwrap()
        }

        /// Who worked, in order (checking that nobody worked while another did).
        fn workers(&self) -> Vec<String> {
            self.log.working().into_iter().map(|w| w.who).collect()
        }
    }

    fn now_secs() -> f64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    /// That service holds; `leasehold run` waits as its waiter; the holder's waiter check asks
    /// for release, it releases (deletes the object) and `leasehold run` gets the lease.
    #[test]
    fn a_lock_service_holder_releases_to_a_waiting_leasehold_run() {
        let t = Scene::new("service-first");
        let mut service = t.service(
            "agent-7",
            None,
            &[
                "--lease",
                "3",
                "--check-every",
                "0.5",
                "--release-on-request",
            ],
        );
        service.wait_line("acquired", S(20));
        let mut lh = t.run("", "b", &["--ttl", "3s", "--wait", "30s"], 0.3);
        service.wait_line("release-requested t/b", S(10));
        service.wait_line("released", S(5));
        service.succeeds(S(5));
        lh.succeeds(S(20));
        assert_eq!(t.workers(), ["agent-7", "t/b"], "{}", t.log.shown());
    }

    /// `leasehold run` holds; that service's process waits: it registers as waiter by rewriting
    /// the object with its four fields only. The lease is still leasehold's: the holder's
    /// handoff fires (`--on-handoff USR1`), the command ends, leasehold releases, and the waiter
    /// gets the lock.
    #[test]
    fn a_lock_service_waiter_gets_the_lease_by_handoff_from_leasehold_run() {
        let t = Scene::new("service-waits");
        let mut lh = t.run("", "a", &["--ttl", "3s", "--on-handoff", "USR1"], 30.0);
        lh.wait_line("working", S(20));
        let mut service = t.service(
            "agent-9",
            None,
            &[
                "--lease",
                "3",
                "--poll",
                "0.2",
                "--timeout",
                "30",
                "--work",
                "0.3",
            ],
        );
        service.wait_line("waiting", S(20));
        lh.wait_line("handoff", S(5));
        lh.succeeds(S(10));
        service.wait_line("acquired", S(10));
        service.wait_line("released", S(5));
        service.succeeds(S(5));
        assert_eq!(t.workers(), ["t/a", "agent-9"], "{}", t.log.shown());
    }

    /// That service judges leasehold's `expiresAt` on its own wall clock, with no margin: a
    /// process of it whose clock runs 60 s ahead, beside a leasehold holder assuming clocks
    /// within 90 s, finds the lease held (it registers as waiter) instead of taking it.
    #[test]
    fn a_lock_service_client_whose_clock_runs_ahead_does_not_take_a_held_lease() {
        let t = Scene::new("service-skew");
        let mut lh = t.run("&max_clock_skew=90s", "a", &["--ttl", "3s"], 4.0);
        lh.wait_line("working", S(20));
        let o = t.object();
        let ahead = o["expiresAt"].as_f64().unwrap() - now_secs();
        assert!(
            ahead > 90.0 && ahead <= 93.5,
            "expiresAt {ahead:.3} s ahead: {o}"
        );
        let once = ["--lease", "3", "--once", "--work", "0.3"];
        let mut service = t.service("agent-9", Some(S(60)), &once);
        service.wait_line("waiting", S(20));
        service.succeeds(S(5));
        lh.succeeds(S(15));
        assert_eq!(t.workers(), ["t/a"], "{}", t.log.shown());
    }

    /// That service's holder is SIGKILLed: its object carries no TTL; leasehold takes it once
    /// it has seen it unchanged for `?foreign_ttl=` (2 s here; 60 s by default), not before the
    /// holder's own `expiresAt`, and without waiting for `max_clock_skew` (5 minutes) past it.
    #[test]
    fn a_killed_lock_service_holders_lease_goes_to_leasehold_after_the_foreign_ttl() {
        let t = Scene::new("service-killed");
        let mut service = t.service("agent-7", None, &["--lease", "2", "--check-every", "0.5"]);
        service.wait_line("acquired", S(20));
        let mut lh = t.run(
            "&foreign_ttl=2s",
            "b",
            &["--ttl", "3s", "--wait", "20s"],
            0.2,
        );
        service.wait_line("release-requested t/b", S(10));
        service.kill();
        let (killed_ns, killed_wall) = (leasehold_testkit::mono_ns(), now_secs());
        // Its work ended with it.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(t.log.path())
            .unwrap();
        writeln!(f, "{killed_ns} agent-7 end").unwrap();
        let o = t.object();
        assert_eq!(o["ownerId"], "agent-7", "{o}");
        let last_expiry = o["expiresAt"].as_f64().unwrap();
        lh.succeeds(S(25));
        assert_eq!(t.workers(), ["agent-7", "t/b"], "{}", t.log.shown());
        let start = t.log.last("t/b", "start").unwrap();
        let start_wall = killed_wall + (start as f64 - killed_ns as f64) / 1e9;
        assert!(
            start_wall >= last_expiry,
            "taken {:.3} s before the killed holder's expiresAt",
            last_expiry - start_wall
        );
        assert!(
            start_wall - killed_wall < 6.0,
            "taken {:.3} s after the kill",
            start_wall - killed_wall
        );
    }
}
