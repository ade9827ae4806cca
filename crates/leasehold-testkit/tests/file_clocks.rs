//! The file store's clocks with real processes: processes whose wall clocks libfaketime moves an
//! hour ahead (their boot-time clocks left alone), and processes in Linux time namespaces whose
//! boot-time clocks are an hour or two ahead of the host's (`unshare --time --boottime`, which
//! needs root, or unprivileged user namespaces), and processes whose every clock libfaketime
//! fakes (the boot-time one included). Places in line lapse on the boot-time clock, a
//! skewed writer leaves the others' times as they wrote them, and processes in different time
//! namespaces judge leases on one clock, the host's.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::stores::file::FileStore;
use leasehold::{Inspection, Key, LeaseRecord, LockStore};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How a worker's clocks are set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Clock {
    /// The host's.
    Host,
    /// The wall clock moved by this many seconds (libfaketime), the others left alone.
    Wall(i64),
    /// Every clock libfaketime fakes moved by this many seconds: the wall clock, and the
    /// monotonic and boot-time clocks too (libfaketime without `FAKETIME_DONT_FAKE_MONOTONIC`,
    /// as the plain `faketime -f +1h CMD` runs it, makes them read the faked wall clock).
    AllClocks(i64),
    /// In a time namespace whose boot-time (and monotonic) clock is this many seconds ahead.
    Namespace(u32),
}

/// A worker process (in a process group of its own) and the lines it prints, as they come.
struct Worker {
    child: Child,
    lines: mpsc::Receiver<String>,
    name: String,
}

impl Worker {
    /// Starts `leasehold-worker ARGS` with its clocks set as `clock` says, and `env`.
    fn start_with(clock: Clock, env: &[(&str, &str)], args: &[&str]) -> Worker {
        let worker = leasehold_testkit::workspace_bin("leasehold-worker");
        let mut c = match clock {
            Clock::Host => Command::new(&worker),
            // libfaketime preloaded directly (see clock_skew.rs).
            Clock::Wall(secs) | Clock::AllClocks(secs) => {
                leasehold_testkit::sweep_faketime_leftovers();
                let mut c = Command::new(&worker);
                c.env("LD_PRELOAD", leasehold_testkit::libfaketime())
                    .env("FAKETIME", format!("{secs:+}s"))
                    .env("FAKETIME_NO_CACHE", "1");
                if let Clock::Wall(_) = clock {
                    c.env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
                }
                c
            }
            Clock::Namespace(secs) => {
                let mut c = Command::new("unshare");
                if !is_root() {
                    c.args(["--user", "--map-root-user"]);
                }
                let secs = secs.to_string();
                c.args(["--time", "--boottime", &secs, "--monotonic", &secs, "--"])
                    .arg(&worker);
                c
            }
        };
        let mut child = c
            .envs(env.iter().copied())
            .args(args)
            .process_group(0)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {worker:?} ({clock:?}): {e}"));
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let name = format!("{} ({clock:?})", args[0]);
        Worker { child, lines, name }
    }

    fn start(clock: Clock, args: &[&str]) -> Worker {
        Self::start_with(clock, &[], args)
    }

    /// The next line within `limit`, if any.
    fn line(&self, limit: Duration) -> Option<String> {
        self.lines.recv_timeout(limit).ok()
    }

    /// The next line, which must come within 20 s.
    fn answer(&self) -> String {
        self.line(Duration::from_secs(20)).unwrap_or_else(|| {
            panic!(
                "{} answered nothing within 20 s{}",
                self.name,
                namespace_hint()
            )
        })
    }

    /// Sends `sig` to the worker.
    fn signal(&self, sig: i32) {
        let pid = i32::try_from(self.child.id()).unwrap();
        // SAFETY: a signal to the process this test started.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "{}", self.name);
    }

    /// SIGKILL to the worker and its group, and its exit reaped.
    fn kill(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: a signal to the process group this test started (its leader is the child).
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        let _ = self.child.wait();
    }

    /// SIGTERM (a `hold` worker releases its lease and exits 0), and its exit awaited.
    fn release(&mut self) {
        self.signal(libc::SIGTERM);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "{} exited {status}", self.name);
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid(2) cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// What a worker that cannot start in a time namespace needs.
fn namespace_hint() -> &'static str {
    " (a worker in a time namespace needs util-linux `unshare` with --time, Linux 5.6+, and root or unprivileged user namespaces)"
}

/// The fence a `hold` worker printed (`held FENCE`).
fn held_fence(w: &Worker, line: &str) -> u64 {
    line.strip_prefix("held ")
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("{}: expected `held FENCE`, got {line:?}", w.name))
}

/// A store directory, its URL, and the store opened in this process (to watch and inspect).
struct Dir {
    _tmp: tempfile::TempDir,
    url: String,
    store: FileStore,
    runtime: tokio::runtime::Runtime,
}

impl Dir {
    fn new() -> Dir {
        let tmp = tempfile::tempdir().unwrap();
        let url = format!("file://{}", tmp.path().display());
        let store = FileStore::open(tmp.path(), Default::default()).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        Dir {
            _tmp: tmp,
            url,
            store,
            runtime,
        }
    }

    /// `key`'s record as this process's `inspect` shows it.
    fn inspect(&self, key: &str) -> Option<LeaseRecord> {
        let key = Key::new(key).unwrap();
        match self.runtime.block_on(self.store.inspect(&key)).unwrap() {
            Some(Inspection::Record(r)) => Some(r),
            other => panic!("{key}: {other:?}"),
        }
    }

    /// `key`'s record file as it is written (what `cat` shows).
    fn written(&self, key: &str) -> LeaseRecord {
        let path = self.store.record_path(&Key::new(key).unwrap());
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
    }

    /// Waits (by the record file's change notifications, at most 20 s) until `key`'s record
    /// satisfies `ok`; what it then holds.
    fn until(&self, key: &str, what: &str, ok: impl Fn(&LeaseRecord) -> bool) -> LeaseRecord {
        let k = Key::new(key).unwrap();
        self.runtime.block_on(async {
            let mut watch = self.store.subscribe(&k).await.unwrap().unwrap();
            let limit = tokio::time::Instant::now() + Duration::from_secs(20);
            loop {
                if let Some(Inspection::Record(r)) = self.store.inspect(&k).await.unwrap() {
                    if ok(&r) {
                        return r;
                    }
                }
                if tokio::time::timeout_at(limit, watch.changed())
                    .await
                    .is_err()
                {
                    panic!("{key}: no record with {what} within 20 s");
                }
            }
        })
    }
}

/// A waiter whose wall clock is an hour ahead takes a place in line behind the registered waiter
/// and is killed there. Once the holder and the registered waiter are done, its place, which
/// moves up to be the registered one, lapses within its lifetime (1 s) on the boot-time clock,
/// and the next waiter gets the lease; an hour is not waited.
#[test]
fn a_place_in_line_taken_by_a_waiter_an_hour_ahead_lapses_on_time() {
    let d = Dir::new();
    let (url, key, ttl) = (d.url.as_str(), "line/ahead", "1000");
    let mut holder = Worker::start(Clock::Host, &["hold", url, key, ttl]);
    let first = held_fence(&holder, &holder.answer());
    let mut registered = Worker::start(Clock::Host, &["hold", url, key, ttl]);
    d.until(key, "a registered waiter", |r| r.waiter.is_some());
    let mut ahead = Worker::start(Clock::Wall(3600), &["hold", url, key, ttl]);
    d.until(key, "a queued waiter", |r| !r.queue.is_empty());
    ahead.kill();
    let killed = Instant::now();
    holder.release();
    let second = held_fence(&registered, &registered.answer());
    assert!(second > first);
    registered.release();
    let next = Worker::start(Clock::Host, &["hold", url, key, ttl]);
    // The killed waiter's place lapses at most its lifetime (1 s) after it was killed; the next
    // waiter polls at least every third of its own, and needs a moment to start.
    let limit = Duration::from_millis(1000 + 3000);
    let line = next
        .line(limit.saturating_sub(killed.elapsed()))
        .unwrap_or_else(|| {
            panic!(
                "the next waiter did not get the lease within {limit:?} of the queued waiter's \
                 death: {:?}",
                d.written(key)
            )
        });
    assert!(held_fence(&next, &line) > second);
    eprintln!(
        "taken {:?} after the queued waiter was killed",
        killed.elapsed()
    );
}

/// A waiter whose wall clock is an hour ahead registers behind a holder of a 30 s lease: the
/// record still says (in its file, and to `inspect` here and in a process an hour ahead) that the
/// lease has at most 30 s left, and the waiter's registration at most its lifetime (5 s).
#[test]
fn a_write_by_a_process_an_hour_ahead_leaves_the_holders_times_as_written() {
    let d = Dir::new();
    let (url, key) = (d.url.as_str(), "show/ahead");
    let holder = Worker::start(Clock::Host, &["hold", url, key, "30000"]);
    held_fence(&holder, &holder.answer());
    let _ahead = Worker::start(Clock::Wall(3600), &["hold", url, key, "30000"]);
    d.until(key, "a registered waiter", |r| r.waiter.is_some());
    let now = leasehold::now_ms();
    let written = d.written(key);
    assert!(
        written.expires_ms <= now + 30_000,
        "the file shows the 30 s lease with {} ms left: {written:?}",
        written.expires_ms.saturating_sub(now)
    );
    let seen = d.inspect(key).unwrap();
    assert!(seen.remaining(now) <= Duration::from_secs(30), "{seen:?}");
    assert!(
        seen.waiter_expires_ms.unwrap() <= leasehold::now_ms() + 5_000,
        "inspect shows the waiter's 5 s registration with {} ms left: {seen:?}",
        seen.waiter_expires_ms.unwrap().saturating_sub(now)
    );
    // A process an hour ahead is shown the same times left, on its own clock.
    for clock in [Clock::Wall(3600), Clock::Host] {
        let w = Worker::start(clock, &["inspect", url, key]);
        let line = w.answer();
        let f: Vec<u64> = line
            .split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect();
        let [remaining, waiter] = f[..] else {
            panic!("{}: {line:?}", w.name)
        };
        assert!(
            (1..=30_000).contains(&remaining) && (1..=5_000).contains(&waiter),
            "{}: {line:?}",
            w.name
        );
    }
}

/// Processes in different time namespaces (the host's, one an hour ahead, one two hours ahead),
/// and one whose every clock libfaketime moves an hour ahead, take turns holding a 10 s lease
/// while each of the others tries it: every one is told it is held.
#[test]
fn a_process_in_another_time_namespace_is_told_a_live_lease_is_held() {
    let d = Dir::new();
    let url = d.url.as_str();
    let clocks = [
        Clock::Host,
        Clock::Namespace(3600),
        Clock::Namespace(7200),
        Clock::AllClocks(3600),
    ];
    for (i, holding) in clocks.into_iter().enumerate() {
        let key = format!("timens/held-{i}");
        let mut holder = Worker::start(holding, &["hold", url, &key, "10000"]);
        let fence = held_fence(&holder, &holder.answer());
        for trying in clocks.into_iter().filter(|c| *c != holding) {
            let w = Worker::start(trying, &["try", url, &key, "10000"]);
            let line = w.answer();
            assert!(
                line.starts_with("busy"),
                "a process {trying:?} got {line:?} while one {holding:?} holds a 10 s lease \
                 (fence {fence})"
            );
        }
        holder.release();
    }
}

/// A holder stopped with SIGSTOP keeps its kernel lock, so its lease ends by its TTL (2 s): a
/// waiter in another time namespace takes it over then, neither at once nor an hour late. Both
/// ways: a holder in the host's namespace and a waiter an hour ahead, and the other way round;
/// and the same with a process whose every clock libfaketime moves an hour ahead.
#[test]
fn a_stopped_holders_lease_ends_on_time_across_time_namespaces() {
    let d = Dir::new();
    let (url, ttl) = (d.url.as_str(), 2000);
    let pairs = [
        (Clock::Host, Clock::Namespace(3600)),
        (Clock::Namespace(3600), Clock::Host),
        (Clock::Host, Clock::AllClocks(3600)),
        (Clock::AllClocks(3600), Clock::Host),
    ];
    for (i, (holding, waiting)) in pairs.into_iter().enumerate() {
        let key = format!("timens/stopped-{i}");
        let holder = Worker::start(holding, &["hold", url, &key, &ttl.to_string()]);
        let first = held_fence(&holder, &holder.answer());
        holder.signal(libc::SIGSTOP);
        let stopped = Instant::now();
        let waiter = Worker::start(waiting, &["hold", url, &key, &ttl.to_string()]);
        // Renewed at most a third of the TTL before it stopped; the waiter polls at least every
        // third of its registration's lifetime and needs a moment to start.
        let limit = Duration::from_millis(ttl + 2000);
        let line = waiter.line(limit).unwrap_or_else(|| {
            panic!(
                "{} did not take over the lease of a stopped holder ({holding:?}) within \
                 {limit:?}: {:?}",
                waiter.name,
                d.written(&key)
            )
        });
        let took = stopped.elapsed();
        assert!(held_fence(&waiter, &line) > first);
        assert!(
            took >= Duration::from_millis(ttl * 2 / 3),
            "{} took over the lease of a stopped holder ({holding:?}) {took:?} after it \
             stopped, before its TTL of {ttl} ms could have run out",
            waiter.name
        );
        eprintln!(
            "{} took over {took:?} after the holder stopped",
            waiter.name
        );
    }
}

/// A process that left its time namespace an hour ahead without an `exec` reads, in
/// `/proc/self/timens_offsets`, the offsets of a namespace it is not in: it cannot place its
/// boot-time clock on the host's, and the store refuses it rather than judge a live lease by a
/// clock an hour off.
#[test]
fn a_process_whose_time_namespace_cannot_be_told_is_refused() {
    let d = Dir::new();
    let (url, key) = (d.url.as_str(), "timens/unknown");
    let holder = Worker::start(Clock::Host, &["hold", url, key, "10000"]);
    let fence = held_fence(&holder, &holder.answer());
    let mut w = Worker::start_with(
        Clock::Namespace(3600),
        &[("LEASEHOLD_WORKER_LEAVE_TIMENS", "0")],
        &["try", url, key, "10000"],
    );
    let status = w.child.wait().unwrap();
    let printed = w.lines.recv().ok();
    assert!(
        !status.success() && printed.is_none(),
        "a process that cannot tell its time namespace exited {status} after {printed:?} \
         while a 10 s lease (fence {fence}) is held"
    );
    assert!(
        holder.line(Duration::ZERO).is_none(),
        "the holder lost its lease"
    );
}
