//! The file store's clocks with real processes: processes whose wall clocks libfaketime moves an
//! hour ahead (their boot-time clocks left alone). Places in line lapse on the boot-time clock,
//! and a skewed writer leaves the others' times as they wrote them.

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
}

/// A worker process (in a process group of its own) and the lines it prints, as they come.
struct Worker {
    child: Child,
    lines: mpsc::Receiver<String>,
    name: String,
}

impl Worker {
    /// Starts `leasehold-worker ARGS` with its clocks set as `clock` says.
    fn start(clock: Clock, args: &[&str]) -> Worker {
        let worker = leasehold_testkit::workspace_bin("leasehold-worker");
        let mut c = match clock {
            Clock::Host => Command::new(&worker),
            // libfaketime preloaded directly (see clock_skew.rs).
            Clock::Wall(secs) => {
                leasehold_testkit::sweep_faketime_leftovers();
                let mut c = Command::new(&worker);
                c.env("LD_PRELOAD", libfaketime())
                    .env("FAKETIME", format!("{secs:+}s"))
                    .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                    .env("FAKETIME_NO_CACHE", "1");
                c
            }
        };
        let mut child = c
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

    /// The next line within `limit`, if any.
    fn line(&self, limit: Duration) -> Option<String> {
        self.lines.recv_timeout(limit).ok()
    }

    /// The next line, which must come within 20 s.
    fn answer(&self) -> String {
        self.line(Duration::from_secs(20))
            .unwrap_or_else(|| panic!("{} answered nothing within 20 s", self.name))
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

/// Debian's libfaketime (package `faketime`), for this machine's architecture.
fn libfaketime() -> std::path::PathBuf {
    std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|d| d.path().join("faketime/libfaketime.so.1"))
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!("libfaketime not found under /usr/lib/*/faketime: apt-get install faketime")
        })
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
