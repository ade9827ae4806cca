//! `leasehold run` on the object stores, against the real servers the test kit starts (moto for
//! `s3://`, Azurite for `az://`): a command gets the lease and its fence, a held lease is refused
//! with `--no-wait`, `inspect` shows the holder, and a waiting `run` in another process makes the
//! holder's `--on-handoff` signal fire and gets the lease with a higher fence.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

/// A child that prints `ready`, then waits for SIGUSR1, touches `$MARKER` and exits 0.
const TRAP_USR1: &str = r#"trap 'touch "$MARKER"; echo got-USR1; exit 0' USR1; echo ready;
    while :; do sleep 0.1 </dev/null >/dev/null 2>&1 & wait $!; done"#;

/// `leasehold --store URL ARGS…` with the server's environment (its credentials).
fn leasehold(url: &str, env: &[(&'static str, String)], args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.env_remove("LEASEHOLD_STORE")
        .env_remove("LEASEHOLD_LOG")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .arg("--store")
        .arg(url)
        .args(args);
    c
}

/// The run, the hand-over and inspection on the store at `url`.
fn run_and_hand_over(url: &str, env: &[(&'static str, String)]) {
    let started = Instant::now();
    let out = leasehold(
        url,
        env,
        &[
            "run",
            "--key",
            "job",
            "--",
            "sh",
            "-c",
            "echo $LEASEHOLD_FENCE",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let first: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();

    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("handed-over");
    let mut holder = leasehold(
        url,
        env,
        &[
            "run",
            "--key",
            "job",
            "--ttl",
            "1s",
            "--on-handoff",
            "USR1",
            "--",
            "sh",
            "-c",
            TRAP_USR1,
        ],
    )
    .env("MARKER", &marker)
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");

    let busy = leasehold(
        url,
        env,
        &["run", "--key", "job", "--no-wait", "--", "true"],
    )
    .output()
    .unwrap();
    assert_eq!(busy.status.code(), Some(75), "{busy:?}");
    let seen = leasehold(url, env, &["inspect", "job", "--json"])
        .output()
        .unwrap();
    assert_eq!(seen.status.code(), Some(0), "{seen:?}");
    let seen: serde_json::Value = serde_json::from_slice(&seen.stdout).unwrap();
    assert_eq!(seen["state"], "held", "{seen}");

    let t = Instant::now();
    let waiter = leasehold(
        url,
        env,
        &[
            "run",
            "--key",
            "job",
            "--wait",
            "20s",
            "--",
            "sh",
            "-c",
            "echo $LEASEHOLD_FENCE",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(waiter.status.code(), Some(0), "{waiter:?}");
    let handed = t.elapsed();
    assert!(handed < Duration::from_secs(10), "{handed:?}");
    let second: u64 = String::from_utf8_lossy(&waiter.stdout)
        .trim()
        .parse()
        .unwrap();
    assert!(second > first, "fence {second} after {first}");
    assert!(marker.exists(), "the holder's command got SIGUSR1");
    assert_eq!(lines.next().unwrap().unwrap(), "got-USR1");
    assert_eq!(holder.wait().unwrap().code(), Some(0));
    eprintln!(
        "{url}: handed over in {handed:?}; whole flow {:?}",
        started.elapsed()
    );
}

#[test]
fn run_and_handoff_on_s3() {
    let moto = leasehold_testkit::s3_server::MotoServer::start();
    let url = moto.url("cli", "runs");
    run_and_hand_over(&url, &moto.env());
}

#[test]
fn run_and_handoff_on_azure_blob() {
    let azurite = leasehold_testkit::azure_server::AzuriteServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = rt.block_on(azurite.url("cli", "runs"));
    run_and_hand_over(&url, &azurite.env());
}
