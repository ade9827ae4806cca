//! `leasehold torture` with real processes: it finds violations where nothing excludes (each
//! client on a memory store of its own) and none on the file store and on a private Redis (no
//! fault, SIGKILL, SIGSTOP).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

/// Runs `leasehold torture ARGS --json`: its exit status and its rows by fault.
fn torture(args: &[&str]) -> (i32, Vec<serde_json::Value>) {
    let out = Command::new(BIN)
        .arg("torture")
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "torture printed {text:?} ({e}); stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(v["seed"].is_u64(), "{v}");
    (
        out.status.code().unwrap(),
        v["rows"].as_array().unwrap().clone(),
    )
}

fn n(row: &serde_json::Value, field: &str) -> u64 {
    row[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {row}"))
}

#[test]
fn the_checker_catches_clients_that_nothing_excludes() {
    let (code, rows) = torture(&["memory", "--duration", "2s", "--faults", "none"]);
    assert_eq!(code, 1, "{rows:?}");
    assert!(n(&rows[0], "overlaps") > 0, "{rows:?}");
}

#[test]
fn the_checker_catches_commands_under_leasehold_run_that_nothing_excludes() {
    let (code, rows) = torture(&[
        "memory",
        "--duration",
        "3s",
        "--faults",
        "none",
        "--via",
        "run",
    ]);
    assert_eq!(code, 1, "{rows:?}");
    assert!(n(&rows[0], "overlaps") > 0, "{rows:?}");
}

#[test]
fn the_file_store_keeps_exclusion_and_fences_under_kills_and_pauses() {
    let (code, rows) = torture(&[
        "file",
        "--duration",
        "9s",
        "--faults",
        "none,kill,stop",
        "--seed",
        "11",
    ]);
    assert_eq!(code, 0, "{rows:?}");
    assert_eq!(rows.len(), 3);
    for row in &rows {
        assert!(n(row, "sections") > 0, "{row}");
        assert_eq!(
            (n(row, "overlaps"), n(row, "fence_violations")),
            (0, 0),
            "{row}"
        );
    }
    assert!(
        rows[1..].iter().all(|r| n(r, "faults_injected") > 0),
        "{rows:?}"
    );
}

#[test]
fn redis_keeps_exclusion_and_fences_under_kills_and_pauses() {
    let (code, rows) = torture(&[
        "redis",
        "--duration",
        "8s",
        "--faults",
        "kill,stop",
        "--seed",
        "12",
    ]);
    assert_eq!(code, 0, "{rows:?}");
    for row in &rows {
        assert!(
            n(row, "sections") > 0 && n(row, "faults_injected") > 0,
            "{row}"
        );
        assert_eq!(
            (n(row, "overlaps"), n(row, "fence_violations")),
            (0, 0),
            "{row}"
        );
    }
}
