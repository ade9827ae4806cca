//! The check-then-create program for the duplicate-creation proof.
//!
//! `leasehold-dedup STORE FINGERPRINT REQUESTS DIR [--no-lock]`: handles REQUESTS concurrent
//! "requests" carrying the same FINGERPRINT. Each takes the fingerprint's lease, checks whether
//! the resource exists (any `*.resource` file in DIR), creates it if not (a new
//! `PID-N.resource` file: creation is not atomic, as with most remote APIs), and releases. The
//! check and the creation are separated by a simulated 2 ms round trip to the resource's API.
//!
//! Prints one line per request, `created` or `exists`, and exits 0 when every request
//! succeeded; with `--no-lock` the lease is skipped (so duplicates show).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

fn fail(msg: String) -> ! {
    eprintln!("leasehold-dedup: {msg}");
    std::process::exit(1)
}

fn exists(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| fail(format!("read {}: {e}", dir.display())))
        .filter_map(|e| e.ok())
        .any(|e| e.file_name().to_string_lossy().ends_with(".resource"))
}

async fn request(locks: Option<Arc<leasehold::Locks>>, fp: String, dir: PathBuf, n: usize) -> bool {
    let guard = match &locks {
        Some(l) => Some(
            l.lock(&fp)
                .unwrap_or_else(|e| fail(e.to_string()))
                .ttl(Duration::from_secs(2))
                .wait(Duration::from_secs(120))
                .acquire()
                .await
                .unwrap_or_else(|e| fail(format!("request {n}: {e}"))),
        ),
        None => None,
    };
    let found = exists(&dir);
    // The round trip between "does it exist?" and "create it" of a remote API.
    tokio::time::sleep(Duration::from_millis(2)).await;
    if !found {
        let f = dir.join(format!("{}-{n}.resource", std::process::id()));
        std::fs::write(&f, &fp).unwrap_or_else(|e| fail(format!("write {}: {e}", f.display())));
    }
    if let Some(g) = guard {
        g.release()
            .await
            .unwrap_or_else(|e| fail(format!("release {n}: {e}")));
    }
    !found
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        fail("usage: leasehold-dedup STORE FINGERPRINT REQUESTS DIR [--no-lock]".into());
    }
    let requests: usize = args[3]
        .parse()
        .unwrap_or_else(|_| fail("bad REQUESTS".into()));
    let dir = PathBuf::from(&args[4]);
    let locks = if args.get(5).map(String::as_str) == Some("--no-lock") {
        None
    } else {
        Some(Arc::new(
            leasehold::connect(&args[1])
                .await
                .unwrap_or_else(|e| fail(e.to_string())),
        ))
    };
    let tasks: Vec<_> = (0..requests)
        .map(|n| tokio::spawn(request(locks.clone(), args[2].clone(), dir.clone(), n)))
        .collect();
    for t in tasks {
        match t.await {
            Ok(true) => println!("created"),
            Ok(false) => println!("exists"),
            Err(e) => fail(format!("request task: {e}")),
        }
    }
}
