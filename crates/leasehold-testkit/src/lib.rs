//! The leasehold test kit: real servers for the tests, helpers that start real processes for
//! multi-process tests, the queue suite, and the library's conformance suite
//! ([`leasehold::conformance`], re-exported as [`suite`]), which every store's integration test
//! runs through [`conformance_tests!`].

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

pub mod azure_server;
pub mod etcd_cluster;
pub mod foreign;
pub mod gcs_server;
pub mod proxy;
pub mod queue_suite;
pub mod s3_server;
pub mod serialising_proxy;
pub mod servers;

use std::path::PathBuf;

/// The conformance suite, which lives in the library (feature `conformance`) so that authors of
/// their own stores can run it.
pub use leasehold::conformance as suite;
pub use leasehold::conformance::prefix;
pub use leasehold::conformance_tests;

/// Takes `n` leases `{stem}/0` … `{stem}/{n-1}` for `ttl` through `l`, 200 at a time.
///
/// # Panics
/// When one is not granted.
pub async fn take_many(
    l: &leasehold::Locks,
    stem: &str,
    n: usize,
    ttl: std::time::Duration,
) -> Vec<leasehold::LeaseGuard> {
    let mut guards = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(200) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|i| {
                let (l, key) = (l.clone(), format!("{stem}/{i}"));
                tokio::spawn(async move {
                    l.lock(&key)
                        .unwrap()
                        .ttl(ttl)
                        .try_acquire()
                        .await
                        .unwrap()
                        .unwrap_or_else(|| panic!("{key} is held"))
                })
            })
            .collect();
        for t in tasks {
            guards.push(t.await.unwrap());
        }
    }
    guards
}

/// A Redis record overwritten with a hash by an operator: 20 leases `{stem}/N` are taken through
/// the store at `url` (record names `{record_prefix}{stem}/N`), and `redis` (a command line to
/// the server holding the record) replaces one with a hash. That lease is lost (`TakenOver`) at
/// its next renewal, the others renewed in the same script calls are not. The hash is a value
/// leasehold cannot read, so it is held by an unknown holder until the server expires it: it
/// inspects and lists as such (with no TTL: held until deleted), force-releasing it finds no
/// lease and leaves it, an acquire is refused; once it is given a TTL, an acquire waits for it
/// to expire and takes the key.
///
/// # Panics
/// When any of that does not hold.
pub async fn overwritten_with_a_hash(url: &str, record_prefix: &str, redis: impl Fn(&[&str])) {
    use std::time::Duration;
    let l = connect_as(url, "typed").await;
    let stem = prefix("typed");
    let ttl = Duration::from_millis(900);
    let guards = take_many(&l, &stem, 20, ttl).await;
    let name = format!("{record_prefix}{stem}/7");
    redis(&["DEL", &name]);
    redis(&["HSET", &name, "f", "v"]);
    let reason = tokio::time::timeout(Duration::from_secs(2), guards[7].lost())
        .await
        .expect("lost fires");
    assert!(
        matches!(reason, leasehold::LostReason::TakenOver { .. }),
        "{reason:?}"
    );
    // Two more renewal periods: every other lease is still held.
    tokio::time::sleep(ttl).await;
    for (i, g) in guards.iter().enumerate() {
        assert_eq!(g.is_current(), i != 7, "lease {i}");
    }
    let key = leasehold::Key::new(format!("{stem}/7")).unwrap();
    let foreign = "unknown (foreign value: a Redis hash; no TTL: held until deleted)";
    let seen = l.store().inspect(&key).await.unwrap();
    assert!(
        matches!(&seen, Some(leasehold::Inspection::Record(r)) if r.holder.as_deref() == Some(foreign) && r.key == key.as_str()),
        "{seen:?}"
    );
    // Listed as held by that unknown holder too, next to the 19 records.
    let listed = l.store().list(&stem).await.unwrap();
    assert_eq!(listed.len(), 20, "{listed:?}");
    let unknown = listed
        .iter()
        .filter(|i| matches!(i, leasehold::Inspection::Record(r) if r.holder.as_deref() == Some(foreign)))
        .count();
    assert_eq!(unknown, 1, "{listed:?}");
    assert_eq!(l.store().force_release(&key).await.unwrap(), None);
    let other = connect_as(url, "other").await;
    let refused = other.lock_key(key.clone()).try_acquire().await.unwrap();
    assert!(
        refused.is_none(),
        "a value leasehold cannot read is never replaced"
    );
    redis(&["PEXPIRE", &name, "300"]);
    let g = other
        .lock_key(key)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("granted once the server expired the hash");
    assert!(g.fence() > 0);
}

/// `cleanup` of `n` stale records through the store at `url`, which holds nothing else: `n`
/// leases are taken and released, then cleaned up while a task reads the progress the store
/// reports. Every reading has `done <= found` and none goes back; at the end both equal the
/// records the report counts, and all `n` were removed.
///
/// # Panics
/// When any of that does not hold.
pub async fn cleanup_progress_ends_at_the_report(url: &str, n: usize) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    let l = connect_as(url, "cleaned").await;
    for g in take_many(&l, &prefix("stale"), n, Duration::from_secs(30)).await {
        g.release().await.unwrap();
    }
    let progress = leasehold::CleanupProgress::new();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let reader = {
        let (progress, stop) = (progress.clone(), stop.clone());
        tokio::spawn(async move {
            let mut last = (0, 0);
            while !stop.load(Ordering::Acquire) {
                let now = progress.get();
                assert!(now.0 <= now.1, "done above found: {now:?}");
                assert!(
                    now.0 >= last.0 && now.1 >= last.1,
                    "went back from {last:?} to {now:?}"
                );
                last = now;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let report = l
        .store()
        .cleanup(Duration::ZERO, &progress)
        .await
        .unwrap_or_else(|e| panic!("cleanup {url}: {e}"));
    stop.store(true, Ordering::Release);
    reader.await.unwrap();
    let total = (report.removed + report.kept) as u64;
    assert_eq!(progress.get(), (total, total), "{url}: {report:?}");
    assert_eq!(report.removed, n, "{url}: {report:?}");
}

/// Locks over the store at `url` acting as `holder`, with the local layer off so the client talks
/// to the store like a separate process would.
///
/// # Panics
/// When the store cannot be opened.
pub async fn connect_as(url: &str, holder: &str) -> leasehold::Locks {
    leasehold::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"))
        .with_holder(leasehold::HolderId::new(holder))
        .with_local_layer(false)
}

/// The lease on `key` through `l` for `ttl`, taken with `try_acquire`.
///
/// # Panics
/// When the store fails or `key` is held.
pub async fn take(
    l: &leasehold::Locks,
    key: &str,
    ttl: std::time::Duration,
) -> leasehold::LeaseGuard {
    match l.lock(key).map(|lock| lock.ttl(ttl)) {
        Ok(lock) => match lock.try_acquire().await {
            Ok(Some(g)) => g,
            Ok(None) => panic!("{key} is held"),
            Err(e) => panic!("taking {key}: {e}"),
        },
        Err(e) => panic!("lock {key}: {e}"),
    }
}

/// `job` is free for `l`: taken at once and released.
///
/// # Panics
/// When it is not.
pub async fn taken_and_released(l: &leasehold::Locks) {
    let g = l.lock("job").unwrap().try_acquire().await.unwrap();
    assert_eq!(
        g.expect("free").release().await.unwrap(),
        leasehold::Released::Released
    );
}

/// Through `l`, whose user `locker` (password `s3cret`) each of `servers` refuses and then
/// accepts again: `job` is taken and released; with the user switched off and its connections
/// killed on each, a waiting acquire fails with a non-retryable authentication error that does
/// not show the password (at once, within 10 s of its 20 s limit, when `timed`); with the user
/// on again, the next acquire goes through.
///
/// # Panics
/// When any of that does not hold.
pub async fn refused_then_accepted(
    l: &leasehold::Locks,
    servers: &[&leasehold_servers::RedisServer],
    timed: bool,
) {
    use std::time::{Duration, Instant};
    taken_and_released(l).await;
    for server in servers {
        server
            .command(&["ACL", "SETUSER", "locker", "off"])
            .unwrap();
        server
            .command(&["CLIENT", "KILL", "USER", "locker"])
            .unwrap();
    }
    let started = Instant::now();
    let err = l
        .lock("job")
        .unwrap()
        .wait(Duration::from_secs(20))
        .acquire()
        .await
        .expect_err("refused");
    assert!(!err.is_retryable(), "{err}");
    assert!(err.to_string().to_lowercase().contains("auth"), "{err}");
    assert!(!err.to_string().contains("s3cret"), "{err}");
    if timed {
        assert!(started.elapsed() < Duration::from_secs(10), "{err}");
    }
    for server in servers {
        server.command(&["ACL", "SETUSER", "locker", "on"]).unwrap();
    }
    taken_and_released(l).await;
}

/// Checks that `e` is the error of a write too few replicas acknowledged in time (`?replicas=`):
/// retryable, naming the replicas.
///
/// # Panics
/// When it is not (`what` names the operation in the message).
pub fn assert_not_replicated(e: &leasehold::Error, what: &str) {
    assert!(
        e.is_retryable() && e.to_string().contains("replicas"),
        "{what}: {e}"
    );
}

/// What `call` answers, once it has answered within 500 ms (beside calls that wait, such as a
/// `WAIT` for a replica that does not answer).
///
/// # Panics
/// When `call` took longer (`what` names it).
pub async fn answered_at_once<T>(what: &str, call: impl std::future::Future<Output = T>) -> T {
    let started = std::time::Instant::now();
    let answer = call.await;
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_millis(500),
        "{what} took {took:?}"
    );
    answer
}

/// A contender for `key` through `l` that only a change notification wakes in a test's time: not
/// registered as waiter (a registration is renewed by waking), with 30 s backoff timers and a 30 s
/// wait limit. Hold `key` with a TTL of 30 s or more, so its expiry does not wake it either. Its
/// guard, and when it got it.
pub fn spawn_deaf_waiter(
    l: leasehold::Locks,
    key: &str,
) -> tokio::task::JoinHandle<(leasehold::Result<leasehold::LeaseGuard>, std::time::Instant)> {
    let key = key.to_owned();
    tokio::spawn(async move {
        let long = std::time::Duration::from_secs(30);
        let g = match l.lock(&key) {
            Ok(b) => {
                b.register_waiter(false)
                    .backoff(leasehold::Backoff {
                        initial: long,
                        max: long,
                    })
                    .wait(long)
                    .acquire()
                    .await
            }
            Err(e) => Err(e),
        };
        (g, std::time::Instant::now())
    })
}

/// Awaits a [`spawn_deaf_waiter`] and checks that it got its lease within 5 s of `released` (its
/// timers are 30 s: only a notification wakes it that soon). Its guard.
///
/// # Panics
/// When it did not, naming `who`.
pub async fn woken_after(
    waiter: tokio::task::JoinHandle<(leasehold::Result<leasehold::LeaseGuard>, std::time::Instant)>,
    released: std::time::Instant,
    who: &str,
) -> leasehold::LeaseGuard {
    let (g, got) = tokio::time::timeout(std::time::Duration::from_secs(10), waiter)
        .await
        .unwrap_or_else(|_| panic!("{who} slept through the failover: it never subscribed again"))
        .expect("the waiter's task");
    let took = got.duration_since(released);
    assert!(
        took < std::time::Duration::from_secs(5),
        "{who} took {took:?} after the release"
    );
    g.unwrap_or_else(|e| panic!("{who}'s lease: {e}"))
}

/// Force-releases `key` as an operator would, through a store opened on `url` now (so after a
/// failover it reaches the new server).
///
/// # Panics
/// When the store cannot be opened or the key is not held.
pub async fn force_release_through(url: &str, key: &str) {
    let store = leasehold::open_store(url)
        .await
        .unwrap_or_else(|e| panic!("open {url}: {e}"));
    let key = leasehold::Key::new(key).unwrap_or_else(|e| panic!("{key}: {e}"));
    let freed = store
        .force_release(&key)
        .await
        .unwrap_or_else(|e| panic!("force-release {key}: {e}"));
    assert!(freed.is_some(), "{key} was not held");
}

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process of a host, so events logged by
/// several processes can be ordered.
pub fn mono_ns() -> u64 {
    // SAFETY: an all-zero timespec is valid; clock_gettime fills it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub use leasehold_servers::sweep_faketime_leftovers;

/// The path of a binary built by this workspace (next to the running test's executable).
pub fn workspace_bin(name: &str) -> PathBuf {
    let mut p = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("."));
    p.pop();
    if p.ends_with("deps") {
        p.pop();
    }
    p.join(name)
}

/// The newest modification time of the files under `dir` (recursively), of those with extension
/// `ext` when given: what a test compares a built artifact's time with, to tell it is stale.
/// The epoch when there is none.
pub fn newest_modified(dir: &std::path::Path, ext: Option<&str>) -> std::time::SystemTime {
    let mut best = std::time::SystemTime::UNIX_EPOCH;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return best;
    };
    for e in entries.flatten() {
        let path = e.path();
        let m = if path.is_dir() {
            newest_modified(&path, ext)
        } else if ext.is_none_or(|ext| path.extension().is_some_and(|x| x == ext)) {
            e.metadata()
                .and_then(|m| m.modified())
                .unwrap_or(std::time::SystemTime::UNIX_EPOCH)
        } else {
            continue;
        };
        best = best.max(m);
    }
    best
}

/// Runs `n` copies of `program args` at once and asserts that every one exits successfully; the
/// worker exits 3 when it found another holder inside its critical section (`overlap` says who).
#[allow(clippy::expect_used)]
pub fn run_all(program: &str, args: &[&str], n: usize, overlap: &str) {
    let children: Vec<std::process::Child> = (0..n)
        .map(|_| {
            std::process::Command::new(program)
                .args(args)
                .spawn()
                .expect("spawn worker")
        })
        .collect();
    for mut c in children {
        let status = c.wait().expect("wait");
        assert!(
            status.success(),
            "worker failed ({status}); exit 3 means {overlap} were inside at once"
        );
    }
}

/// Debian's libfaketime (package `faketime`), for this machine's architecture: what a test
/// preloads to run a process with a moved wall clock.
///
/// # Panics
/// When it is not installed (`apt-get install faketime`; the test command installs it).
pub fn libfaketime() -> PathBuf {
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
