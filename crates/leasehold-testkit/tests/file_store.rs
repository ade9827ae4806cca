//! File-store behaviour with real processes: exclusion across 8 OS processes, SIGKILL and SIGSTOP
//! of a holder, fences across restarts, hostile keys, corrupt records, modes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::stores::file::{FileOptions, FileStore};
use leasehold::{Inspection, Key, LockStore, Locks};
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const WORKER: &str = env!("CARGO_BIN_EXE_leasehold-worker");

fn url(dir: &std::path::Path) -> String {
    format!("file://{}", dir.display())
}

/// Starts `leasehold-worker hold` and waits for its `held FENCE` line.
fn hold(
    dir: &std::path::Path,
    key: &str,
    ttl_ms: u64,
) -> (Child, u64, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(WORKER)
        .args(["hold", &url(dir), key, &ttl_ms.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn worker");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("read worker");
    let fence = line
        .trim()
        .strip_prefix("held ")
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("worker said {line:?}"));
    (child, fence, out)
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: plain kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

#[test]
fn eight_processes_never_overlap_and_count_to_400() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("locks");
    let work = dir.path().join("work");
    std::fs::create_dir(&work).expect("mkdir");
    let t = Instant::now();
    leasehold_testkit::run_all(
        WORKER,
        &[
            "count",
            &url(&store),
            "counter",
            "50",
            work.to_str().expect("utf8"),
        ],
        8,
        "two processes",
    );
    let count = std::fs::read_to_string(work.join("counter")).expect("counter");
    assert_eq!(count.trim(), "400");
    eprintln!("8 × 50 critical sections in {:?}", t.elapsed());
}

#[tokio::test]
async fn a_holder_killed_with_sigkill_frees_the_lease_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, fence, _out) = hold(dir.path(), "job", 30_000);
    let locks = leasehold::connect(&url(dir.path())).await.expect("connect");
    assert!(locks
        .lock("job")
        .expect("k")
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    signal(&child, libc::SIGKILL);
    child.wait().expect("wait");
    let t = Instant::now();
    let g = locks
        .lock("job")
        .expect("k")
        .try_acquire()
        .await
        .expect("try")
        .expect("freed by the kernel at once");
    assert!(t.elapsed() < Duration::from_secs(1));
    assert!(g.fence() > fence);
    g.release().await.expect("release");
}

#[tokio::test]
async fn a_stopped_holder_loses_the_lease_by_ttl_and_learns_it_on_resume() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, fence, mut out) = hold(dir.path(), "job", 800);
    signal(&child, libc::SIGSTOP);
    let locks = leasehold::connect(&url(dir.path())).await.expect("connect");
    let t = Instant::now();
    let g = locks
        .lock("job")
        .expect("k")
        .ttl(Duration::from_secs(2))
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("taken over after TTL");
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t.elapsed()
    );
    assert!(g.fence() > fence);
    let Some(Inspection::Record(r)) = locks.store().inspect(g.key()).await.expect("inspect") else {
        panic!()
    };
    assert_eq!(
        r.store.get("kernel_lock").map(String::as_str),
        Some("none"),
        "the stopped process still has the kernel lock"
    );
    signal(&child, libc::SIGCONT);
    let mut line = String::new();
    out.read_line(&mut line).expect("read");
    assert!(line.starts_with("lost"), "resumed holder said {line:?}");
    assert_eq!(child.wait().expect("wait").code(), Some(4));
    // Our lease survives the old holder's exit: it no longer had the lease, its kernel lock going
    // away must not make us look dead; and at our next renewal we pick the kernel lock up.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(g.is_current());
    let Some(Inspection::Record(r)) = locks.store().inspect(g.key()).await.expect("inspect") else {
        panic!()
    };
    assert_eq!(r.store.get("kernel_lock").map(String::as_str), Some("held"));
    let other = Locks::from_arc(locks.store().clone()).with_local_layer(false);
    assert!(other
        .lock("job")
        .expect("k")
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    g.release().await.expect("release");
}

#[tokio::test]
async fn sigterm_releases_and_the_waiter_takes_over() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, fence, _out) = hold(dir.path(), "job", 30_000);
    let locks = leasehold::connect(&url(dir.path())).await.expect("connect");
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .lock("job")
                .expect("k")
                .wait(Duration::from_secs(10))
                .acquire()
                .await
        }
    });
    signal(&child, libc::SIGTERM);
    assert!(child.wait().expect("wait").success());
    let g = waiter.await.expect("task").expect("waiter gets the lease");
    assert!(g.fence() > fence);
    g.release().await.expect("release");
}

#[tokio::test]
async fn fences_survive_restarts_and_cleanup() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut last = 0;
    for _ in 0..3 {
        // A new process each time.
        let (mut child, fence, _out) = hold(dir.path(), "job", 30_000);
        assert!(
            fence > last,
            "fence {fence} after restart is not above {last}"
        );
        last = fence;
        signal(&child, libc::SIGTERM);
        child.wait().expect("wait");
    }
    let store = FileStore::open(dir.path(), FileOptions::default()).expect("open");
    store
        .cleanup(Duration::ZERO, &leasehold::CleanupProgress::new())
        .await
        .expect("cleanup");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("ls")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(
        left,
        [".leasehold-fences"],
        "cleanup left the free record, or no high-water mark"
    );
    let (mut child, fence, _out) = hold(dir.path(), "job", 30_000);
    assert!(
        fence > last,
        "fence {fence} after cleanup is not above {last}"
    );
    signal(&child, libc::SIGKILL);
    child.wait().expect("wait");
}

/// A record whose fence is an hour of microseconds ahead of this clock (written by a host whose
/// clock ran an hour ahead) is deleted by `cleanup`: the key created again is fenced above it,
/// by the high-water mark, not by the clock. A mark that holds no fence stops grants on new
/// records (a typed error naming it) and leaves existing records alone.
#[tokio::test]
async fn a_record_cleaned_up_is_created_again_above_its_fence_whatever_the_clock() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = FileStore::open(dir.path(), FileOptions::default()).expect("open");
    let locks = Locks::new(store);
    let g = locks
        .lock("ahead")
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    g.release().await.unwrap();
    let file = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "lease"))
        .expect("record file");
    let mut record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let ahead = record["fence"].as_u64().unwrap() + 3_600_000_000;
    record["fence"] = ahead.into();
    std::fs::write(&file, serde_json::to_vec_pretty(&record).unwrap()).unwrap();
    let store = FileStore::open(dir.path(), FileOptions::default()).expect("open");
    assert_eq!(
        store
            .cleanup(Duration::ZERO, &leasehold::CleanupProgress::new())
            .await
            .unwrap()
            .removed,
        1
    );
    let g = locks
        .lock("ahead")
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    assert!(
        g.fence() > ahead,
        "fence {} after cleanup deleted a record at {ahead}",
        g.fence()
    );
    g.release().await.unwrap();

    std::fs::write(dir.path().join(".leasehold-fences"), "garbage").unwrap();
    let err = locks
        .lock("new")
        .unwrap()
        .try_acquire()
        .await
        .expect_err("granted above an unreadable mark");
    assert!(
        matches!(err, leasehold::Error::Corrupt { .. })
            && err.to_string().contains(".leasehold-fences"),
        "{err}"
    );
    let g = locks.lock("ahead").unwrap().try_acquire().await.unwrap();
    assert!(g.is_some(), "an existing record needs no mark");
}

#[tokio::test]
async fn hostile_keys_stay_inside_the_directory() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("a/b/locks");
    let store = FileStore::open(&dir, FileOptions::default()).expect("open creates the directory");
    let locks = Locks::new(store.clone());
    for k in [
        "../x",
        "../../x",
        "/etc/passwd",
        "..",
        ".",
        ".hidden",
        "a/b",
        "x\\y",
        "🔒",
        &"z".repeat(1024),
    ] {
        let g = locks
            .lock(k)
            .expect("valid key")
            .try_acquire()
            .await
            .expect("acquire")
            .expect("free");
        let path = store.record_path(g.key());
        assert_eq!(path.parent(), Some(dir.as_path()), "{k:?} → {path:?}");
        g.release().await.expect("release");
    }
    let mut outside: Vec<_> = walk(root.path())
        .into_iter()
        .filter(|p| !p.starts_with(&dir))
        .collect();
    outside.sort();
    assert_eq!(
        outside,
        vec![root.path().join("a"), root.path().join("a/b")]
    );
    for p in walk(&dir) {
        let mode = std::fs::metadata(&p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{p:?} has mode {mode:o}");
        let text = std::fs::read_to_string(&p).expect("read");
        let v: serde_json::Value = serde_json::from_str(&text).expect("records are JSON");
        for field in [
            "key", "holder", "fence", "acquired", "expires", "waiter", "pid", "host", "labels",
        ] {
            assert!(v.get(field).is_some(), "{field} missing in {text}");
        }
    }
}

fn walk(p: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(p).expect("ls").flatten() {
        let path = e.path();
        out.push(path.clone());
        if path.is_dir() {
            out.extend(walk(&path));
        }
    }
    out
}

#[tokio::test]
async fn symlinks_are_not_followed() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = FileStore::open(root.path().join("locks"), FileOptions::default()).expect("open");
    let target = root.path().join("precious");
    std::fs::write(&target, "do not touch").expect("write");
    let key = Key::new("job").expect("k");
    std::os::unix::fs::symlink(&target, store.record_path(&key)).expect("symlink");
    let locks = Locks::new(store);
    let err = locks
        .lock_key(key)
        .try_acquire()
        .await
        .expect_err("a symlinked record is refused");
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&target).expect("read"),
        "do not touch"
    );
}

#[tokio::test]
async fn corrupt_and_truncated_records_are_reported_and_recovered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = FileStore::open(dir.path(), FileOptions::default()).expect("open");
    let locks = Locks::new(store.clone());
    let key = Key::new("job").expect("k");
    let g = locks
        .lock_key(key.clone())
        .try_acquire()
        .await
        .expect("a")
        .expect("free");
    let fence = g.fence();
    g.release().await.expect("release");
    let path = store.record_path(&key);
    let full = std::fs::read(&path).expect("read");
    for damaged in [
        full[..full.len() / 2].to_vec(),
        b"\0\0\0garbage".to_vec(),
        b"{\"fence\": 18446744073709551000, \"x\"".to_vec(),
    ] {
        std::fs::write(&path, &damaged).expect("damage");
        match store.inspect(&key).await.expect("inspect") {
            Some(Inspection::Corrupt { name, detail }) => {
                assert!(name.ends_with(".lease") && !detail.is_empty())
            }
            other => panic!("damaged record inspected as {other:?}"),
        }
        assert!(store
            .list("")
            .await
            .expect("list")
            .iter()
            .any(|i| matches!(i, Inspection::Corrupt { .. })));
        let g = locks
            .lock_key(key.clone())
            .try_acquire()
            .await
            .expect("recovers")
            .expect("free");
        assert!(g.fence() > fence, "fence went backwards after corruption");
        if damaged.starts_with(b"{\"fence\"") {
            assert!(g.fence() > 18446744073709551000);
        }
        g.release().await.expect("release");
    }
}

#[tokio::test]
async fn a_configured_mode_is_used_and_bad_urls_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let locks = leasehold::connect(&format!("file://{}/shared?mode=0640", dir.path().display()))
        .await
        .expect("connect");
    let g = locks
        .lock("job")
        .expect("k")
        .try_acquire()
        .await
        .expect("a")
        .expect("free");
    let store = FileStore::open(dir.path().join("shared"), FileOptions::default()).expect("open");
    let mode = std::fs::metadata(store.record_path(g.key()))
        .expect("stat")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o640);
    g.release().await.expect("release");
    for bad in [
        "file://host/x",
        "file:///x?mode=99",
        "file:///x?fsync=maybe",
        "file:///x?colour=red",
        "file:///x?mode=0400",
    ] {
        let err = leasehold::open_store(bad).await.expect_err(bad);
        assert!(
            matches!(
                err,
                leasehold::Error::InvalidUrl { .. } | leasehold::Error::InvalidOption { .. }
            ),
            "{bad}: {err}"
        );
    }
}

#[tokio::test]
async fn a_waiter_wakes_when_the_holder_is_killed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, fence, _out) = hold(dir.path(), "job", 30_000);
    let locks = leasehold::connect(&url(dir.path())).await.expect("connect");
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            let g = locks
                .lock("job")
                .expect("k")
                .wait(Duration::from_secs(10))
                .acquire()
                .await;
            (g, Instant::now())
        }
    });
    // Let the waiter subscribe and register (a condition with no event to await from here).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed = Instant::now();
    signal(&child, libc::SIGKILL);
    child.wait().expect("wait");
    let (g, got) = waiter.await.expect("task");
    let g = g.expect("waiter gets the lease");
    let latency = got.duration_since(killed);
    assert!(
        latency < Duration::from_millis(250),
        "woke {latency:?} after the holder died (the timer, not inotify)"
    );
    assert!(g.fence() > fence);
    g.release().await.expect("release");
}

#[tokio::test]
async fn labels_too_large_to_read_back_are_refused_with_the_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = FileStore::open(dir.path(), FileOptions::default()).expect("open");
    let locks = Locks::new(store.clone());
    // 2 MiB of label: the record could not be read back whole (reads stop at 1 MiB), so another
    // process would judge it corrupt while its holder lives.
    let err = locks
        .lock("big")
        .expect("key")
        .label("blob", "x".repeat(2 << 20))
        .try_acquire()
        .await
        .expect_err("a record that cannot be read back is never written");
    assert!(
        matches!(err, leasehold::Error::InvalidOption { name: "labels", .. }),
        "{err:?}"
    );
    let limit = leasehold::stores::file::LABEL_LIMIT;
    assert!(err.to_string().contains(&limit.to_string()), "{err}");
    assert!(store
        .inspect(&Key::new("big").expect("k"))
        .await
        .expect("inspect")
        .is_none());
    // Up to the limit is fine, and is read back whole by another store of the directory.
    let fits = "y".repeat(limit - 100);
    let g = locks
        .lock("big")
        .expect("key")
        .label("blob", fits.clone())
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free");
    let other = FileStore::open(dir.path(), FileOptions::default()).expect("open");
    match other
        .inspect(&Key::new("big").expect("k"))
        .await
        .expect("inspect")
    {
        Some(Inspection::Record(r)) => assert_eq!(r.labels.get("blob"), Some(&fits)),
        other => panic!("read back as {other:?}"),
    }
    g.release().await.expect("release");
}

/// A record damaged while its holder process lives is held by "unknown (corrupt record)" until the
/// kernel lock says the holder is gone; then it is recovered above the holder's fence.
#[tokio::test]
async fn a_corrupt_record_is_held_while_its_holder_process_lives() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, fence, _out) = hold(dir.path(), "job", 60_000);
    let store = FileStore::open(dir.path(), FileOptions::default()).expect("open");
    let key = Key::new("job").expect("k");
    std::fs::write(store.record_path(&key), b"\0\0\0garbage").expect("damage");
    let locks = Locks::new(store.clone());
    let err = locks
        .lock_key(key.clone())
        .wait(Duration::from_millis(300))
        .acquire()
        .await
        .expect_err("granted while its holder process lives");
    assert!(
        matches!(&err, leasehold::Error::Timeout { holder, .. } if holder.contains("corrupt record")),
        "{err:?}"
    );
    signal(&child, libc::SIGKILL);
    child.wait().expect("wait");
    let g = locks
        .lock_key(key)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("recovered once the holder is gone");
    assert!(g.fence() > fence, "{} after {fence}", g.fence());
    g.release().await.expect("release");
}

/// `cleanup` of 200 stale records reports its progress record by record, ending at its report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_progress_of_200_stale_records_ends_at_the_report() {
    let dir = tempfile::tempdir().expect("tempdir");
    leasehold_testkit::cleanup_progress_ends_at_the_report(&url(dir.path()), 200).await;
}
