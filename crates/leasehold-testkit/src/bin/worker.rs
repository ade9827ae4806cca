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
//! `leasehold-worker hold STORE KEY TTL_MS`: acquire KEY, print `held FENCE`, then wait; print
//! `lost REASON` and exit 4 when the lease is lost; exit 0 on SIGTERM after releasing.

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

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
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
        "hold" => {
            let ttl: u64 = arg(4).parse().unwrap_or_else(|_| fail("bad ttl".into()));
            // Before "held" is printed, so a SIGTERM right after it is handled.
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .unwrap_or_else(|e| fail(e.to_string()));
            let g = locks
                .lock_key(key)
                .ttl(Duration::from_millis(ttl))
                .wait(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap_or_else(|e| fail(e.to_string()));
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
        other => fail(format!("unknown mode {other}")),
    }
}
