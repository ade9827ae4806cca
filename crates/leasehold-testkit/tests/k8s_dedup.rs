//! The duplicate-creation proof on Kubernetes Leases (leasehold-apiserver over a real etcd):
//! 3 OS processes × 100 concurrent requests with the same fingerprint check whether a resource
//! exists and create it if not. Under the fingerprint's lease exactly one resource is created and
//! every request succeeds; without the lease the same run creates duplicates.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold_testkit::servers::shared_apiserver;
use leasehold_testkit::workspace_bin;
use std::path::Path;
use std::process::{Command, Stdio};

/// Runs 3 processes × 100 requests; returns (resources created, lines "created", lines "exists").
fn run(url: &str, dir: &Path, lock: bool) -> (usize, usize, usize) {
    let children: Vec<_> = (0..3)
        .map(|_| {
            let mut c = Command::new(workspace_bin("leasehold-dedup"));
            c.args([url, "fp:sha256:8d3c7e", "100"]).arg(dir);
            if !lock {
                c.arg("--no-lock");
            }
            c.stdout(Stdio::piped()).spawn().expect("leasehold-dedup")
        })
        .collect();
    let (mut created, mut existed) = (0, 0);
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.lines().count(), 100, "every request answers: {text}");
        created += text.lines().filter(|l| *l == "created").count();
        existed += text.lines().filter(|l| *l == "exists").count();
    }
    let files = std::fs::read_dir(dir).unwrap().count();
    (files, created, existed)
}

#[test]
fn one_resource_under_the_lease_duplicates_without_it() {
    let server = shared_apiserver();
    let url = format!("{}&prefix=dedup-", server.store_url("dedup"));

    let locked = tempfile::tempdir().unwrap();
    let (files, created, existed) = run(&url, locked.path(), true);
    assert_eq!((files, created, existed), (1, 1, 299));

    let unlocked = tempfile::tempdir().unwrap();
    let (files, created, _) = run(&url, unlocked.path(), false);
    assert!(
        files > 1,
        "without the lease the race shows: {files} resources"
    );
    assert_eq!(files, created);
}
