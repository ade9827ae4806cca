//! A worker process for multi-process tests.
//!
//! `leasehold-worker count STORE KEY ITERATIONS DIR`: ITERATIONS times, acquire KEY, then in the
//! critical section create `DIR/inside` exclusively (failing means another process is inside),
//! read `DIR/counter`, write it back plus one, remove `DIR/inside`, release. Exit 0, or 3 on an
//! overlap.
//!
//! `leasehold-worker tasks STORE KEY TASKS ITERATIONS DIR`: TASKS tasks of this process each
//! ITERATIONS times acquire KEY (so the lease is handed from task to task inside the process),
//! create `DIR/inside` exclusively (exit 3 on an overlap), append the fence to `DIR/fences`,
//! remove `DIR/inside`, release.
//!
//! `leasehold-worker fenced STORE KEY DIR MILLIS TTL_MS`: for MILLIS, acquire KEY (TTL_MS, waiting
//! up to 2 s at a time and trying again after store errors), then write three steps to the fenced
//! resource in DIR ([`fenced_write`]) 20 ms apart without looking at the lease again — an
//! application that checks its lease once per job, which a pause can catch mid-job — and release.
//! Prints `sections N` at the end.
//!
//! `leasehold-worker hold STORE KEY TTL_MS [PERMITS]`: acquire KEY (with PERMITS, a permit of
//! KEY as a semaphore of PERMITS), print `held FENCE`, then wait; print `lost REASON` and exit 4
//! when the lease is lost; exit 0 on SIGTERM after releasing.
//!
//! `leasehold-worker try STORE KEY TTL_MS`: try to acquire KEY once, without waiting: print
//! `granted FENCE` and release, or `busy HOLDER`.
//!
//! `leasehold-worker probe STORE STEM TTL_MS`: for each line `N` read from stdin, try to acquire
//! `STEM/N` once as `try` does, printing one line per try.
//!
//! `leasehold-worker inspect STORE KEY`: print `remaining MS waiter MS` (the lease's time left and
//! the registered waiter's, by this process's wall clock; 0 for none), or `none`.
//!
//! With `LEASEHOLD_WORKER_LEAVE_TIMENS=SECS` in its environment, the worker first leaves its time
//! namespace without an `exec`: it unshares a new one for its children (`CLONE_NEWTIME`, needing
//! `CAP_SYS_ADMIN`) and gives that one a boot-time offset of SECS, so that
//! `/proc/self/timens_offsets` describes a namespace the worker's own clocks are not in.

use std::io::Write;
use std::time::Duration;

fn fail(msg: String) -> ! {
    eprintln!("leasehold-worker: {msg}");
    std::process::exit(1)
}

/// Enters the critical section: creates `DIR/inside` exclusively, or exits 3 when another holder
/// is inside. Returns the path to remove on leaving.
fn enter(dir: &std::path::Path) -> std::path::PathBuf {
    let inside = dir.join("inside");
    if std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&inside)
        .is_err()
    {
        eprintln!("OVERLAP: another holder is inside the critical section");
        std::process::exit(3);
    }
    inside
}

/// Waits for `key` (TTL 10 s, up to 120 s) and enters the critical section in `dir`.
async fn hold(
    locks: &leasehold::Locks,
    key: &leasehold::Key,
    dir: &std::path::Path,
) -> (leasehold::LeaseGuard, std::path::PathBuf) {
    let g = locks
        .lock_key(key.clone())
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(120))
        .acquire()
        .await
        .unwrap_or_else(|e| fail(e.to_string()));
    (g, enter(dir))
}

/// A write to the fenced resource in `dir`, as a storage service that knows fences does it: under
/// an exclusive `flock` of `DIR/resource.lock`, a fence below the highest seen (`DIR/max`) is
/// rejected (a line in `DIR/rejected`); any other is accepted (a line in `DIR/log`) and becomes
/// the highest seen. Lines are `FENCE PID STEP TIME` (TIME: CLOCK_MONOTONIC ns).
fn fenced_write(dir: &std::path::Path, fence: u64, step: u32) {
    use std::os::fd::AsRawFd;
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("resource.lock"))
        .unwrap_or_else(|e| fail(e.to_string()));
    // SAFETY: flock(2) on a descriptor we own; the lock goes with it when `lock` is dropped.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        fail(std::io::Error::last_os_error().to_string());
    }
    let max: u64 = std::fs::read_to_string(dir.join("max"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let line = format!(
        "{fence} {} {step} {}\n",
        std::process::id(),
        leasehold_testkit::mono_ns()
    );
    let file = if fence < max {
        "rejected"
    } else {
        // Written whole and renamed over: a worker killed here leaves the old value, never none.
        let next = dir.join(format!("max.{}", std::process::id()));
        std::fs::write(&next, fence.to_string())
            .and_then(|()| std::fs::rename(&next, dir.join("max")))
            .unwrap_or_else(|e| fail(e.to_string()));
        "log"
    };
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(dir.join(file))
        .and_then(|mut f| f.write_all(line.as_bytes()))
        .unwrap_or_else(|e| fail(e.to_string()));
}

/// Tries to acquire `key` once, without waiting: `granted FENCE` (released again), or
/// `busy HOLDER`.
async fn try_once(locks: &leasehold::Locks, key: leasehold::Key, ttl: u64) -> String {
    match locks
        .lock_key(key.clone())
        .ttl(Duration::from_millis(ttl))
        .try_acquire()
        .await
    {
        Ok(Some(g)) => {
            let fence = g.fence();
            if let Err(e) = g.release().await {
                fail(e.to_string());
            }
            format!("granted {fence}")
        }
        Ok(None) => {
            let holder = match locks.store().inspect(&key).await {
                Ok(Some(leasehold::Inspection::Record(r))) => r.holder.unwrap_or_default(),
                _ => String::new(),
            };
            format!("busy {holder}")
        }
        Err(e) => fail(e.to_string()),
    }
}

/// See the module docs (`LEASEHOLD_WORKER_LEAVE_TIMENS`).
fn leave_time_namespace(secs: &str) {
    // SAFETY: unshare(2) with a flag and no pointers.
    if unsafe { libc::unshare(libc::CLONE_NEWTIME) } != 0 {
        fail(format!(
            "unshare(CLONE_NEWTIME): {}",
            std::io::Error::last_os_error()
        ));
    }
    std::fs::write("/proc/self/timens_offsets", format!("boottime {secs} 0\n"))
        .unwrap_or_else(|e| fail(format!("/proc/self/timens_offsets: {e}")));
}

fn main() {
    if let Ok(secs) = std::env::var("LEASEHOLD_WORKER_LEAVE_TIMENS") {
        leave_time_namespace(&secs);
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(e.to_string()))
        .block_on(run());
}

async fn run() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize| {
        args.get(i)
            .cloned()
            .unwrap_or_else(|| fail(format!("missing argument {i}")))
    };
    let locks = match leasehold::connect(&arg(2)).await {
        Ok(l) => l,
        Err(e) => fail(e.to_string()),
    };
    let key = leasehold::Key::new(arg(3)).unwrap_or_else(|e| fail(e.to_string()));
    match arg(1).as_str() {
        "count" => {
            let n: u32 = arg(4)
                .parse()
                .unwrap_or_else(|_| fail("bad iterations".into()));
            let dir = std::path::PathBuf::from(arg(5));
            for _ in 0..n {
                let (g, inside) = hold(&locks, &key, &dir).await;
                let counter = dir.join("counter");
                let v: u64 = std::fs::read_to_string(&counter)
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(0);
                // Widen the window a racing process would need.
                std::thread::sleep(Duration::from_micros(200));
                std::fs::write(&counter, format!("{}\n", v + 1))
                    .unwrap_or_else(|e| fail(e.to_string()));
                std::fs::remove_file(&inside).unwrap_or_else(|e| fail(e.to_string()));
                if let Err(e) = g.release().await {
                    fail(e.to_string());
                }
            }
        }
        "tasks" => {
            let num = |i: usize| -> usize {
                arg(i)
                    .parse()
                    .unwrap_or_else(|_| fail(format!("bad number {:?}", arg(i))))
            };
            let (tasks, n) = (num(4), num(5));
            let dir = std::path::PathBuf::from(arg(6));
            let mut all = vec![];
            for _ in 0..tasks {
                let (locks, key, dir) = (locks.clone(), key.clone(), dir.clone());
                all.push(tokio::spawn(async move {
                    for _ in 0..n {
                        let (g, inside) = hold(&locks, &key, &dir).await;
                        let line = format!("{} {}\n", g.fence(), std::process::id());
                        std::fs::OpenOptions::new()
                            .append(true)
                            .create(true)
                            .open(dir.join("fences"))
                            .and_then(|mut f| f.write_all(line.as_bytes()))
                            .unwrap_or_else(|e| fail(e.to_string()));
                        tokio::task::yield_now().await;
                        std::fs::remove_file(&inside).unwrap_or_else(|e| fail(e.to_string()));
                        if let Err(e) = g.release().await {
                            fail(e.to_string());
                        }
                    }
                }));
            }
            for t in all {
                if t.await.is_err() {
                    fail("a task panicked".into());
                }
            }
        }
        "fenced" => {
            let dir = std::path::PathBuf::from(arg(4));
            let num = |i: usize| -> u64 {
                arg(i)
                    .parse()
                    .unwrap_or_else(|_| fail(format!("bad number {:?}", arg(i))))
            };
            let (end, ttl) = (
                std::time::Instant::now() + Duration::from_millis(num(5)),
                Duration::from_millis(num(6)),
            );
            let mut sections = 0u64;
            while std::time::Instant::now() < end {
                let wait = end
                    .saturating_duration_since(std::time::Instant::now())
                    .min(Duration::from_secs(2));
                let g = match locks
                    .lock_key(key.clone())
                    .ttl(ttl)
                    .wait(wait)
                    .acquire()
                    .await
                {
                    Ok(g) => g,
                    Err(leasehold::Error::Timeout { .. }) => continue,
                    Err(e) if e.is_retryable() => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                    Err(e) => fail(e.to_string()),
                };
                for step in 0..3 {
                    fenced_write(&dir, g.fence(), step);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                // A lease lost meanwhile (a pause, a store fault) is reported, not fatal here.
                let _ = g.release().await;
                sections += 1;
            }
            println!("sections {sections}");
        }
        "hold" => {
            let ttl: u64 = arg(4).parse().unwrap_or_else(|_| fail("bad ttl".into()));
            // Before "held" is printed, so a SIGTERM right after it is handled.
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .unwrap_or_else(|e| fail(e.to_string()));
            let (ttl, wait) = (Duration::from_millis(ttl), Duration::from_secs(30));
            let got = match args.get(5) {
                Some(n) => {
                    let n: u32 = n.parse().unwrap_or_else(|_| fail("bad permits".into()));
                    let sem = locks
                        .semaphore(key.as_str(), n)
                        .unwrap_or_else(|e| fail(e.to_string()));
                    sem.ttl(ttl).wait(wait).acquire().await
                }
                None => locks.lock_key(key).ttl(ttl).wait(wait).acquire().await,
            };
            let g = got.unwrap_or_else(|e| fail(e.to_string()));
            println!("held {}", g.fence());
            let _ = std::io::stdout().flush();
            tokio::select! {
                reason = g.lost() => {
                    println!("lost {reason}");
                    let _ = std::io::stdout().flush();
                    std::process::exit(4);
                }
                _ = term.recv() => {
                    let _ = g.release().await;
                }
            }
        }
        "try" => {
            let ttl: u64 = arg(4).parse().unwrap_or_else(|_| fail("bad ttl".into()));
            println!("{}", try_once(&locks, key, ttl).await);
        }
        "probe" => {
            let ttl: u64 = arg(4).parse().unwrap_or_else(|_| fail("bad ttl".into()));
            let mut lines = std::io::stdin().lines();
            while let Some(Ok(line)) = lines.next() {
                let name = format!("{}/{}", key.as_str(), line.trim());
                let key = leasehold::Key::new(name).unwrap_or_else(|e| fail(e.to_string()));
                println!("{}", try_once(&locks, key, ttl).await);
                let _ = std::io::stdout().flush();
            }
        }
        "inspect" => {
            let now = leasehold::now_ms();
            match locks.store().inspect(&key).await {
                Ok(Some(leasehold::Inspection::Record(r))) => {
                    let waiter = match (&r.waiter_token, r.waiter_expires_ms) {
                        (Some(_), Some(e)) => e.saturating_sub(now),
                        _ => 0,
                    };
                    println!("remaining {} waiter {waiter}", r.remaining(now).as_millis());
                }
                Ok(_) => println!("none"),
                Err(e) => fail(e.to_string()),
            }
        }
        other => fail(format!("unknown mode {other}")),
    }
}
