//! `leasehold bench --floor` on the real servers the test kit starts: every row gets the store's
//! floor beside it (its per-second figure and the ratio leasehold / floor), in the table and in
//! `--json`, and the object stores the requests per cycle or handoff of both.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::Value;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

/// `leasehold --store URL bench --floor --tasks 1,2 --duration 200ms [--json]` with `env`:
/// its stdout, after checking that it succeeded.
fn bench(url: &str, env: &[(&'static str, String)], json: bool) -> String {
    let mut c = Command::new(BIN);
    c.env_remove("LEASEHOLD_STORE")
        .env_remove("LEASEHOLD_LOG")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .args(["--store", url, "bench", "--floor", "--tasks", "1,2"])
        .args(["--duration", "200ms"]);
    if json {
        c.arg("--json");
    }
    let out = c.output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{url}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The table and the JSON of `bench --floor` on `url`: 4 rows (2 task counts × distinct keys
/// and one hot key), each with the floor's figure and a ratio; `counted`: with requests per
/// operation, of leasehold and of the floor.
fn floor_beside_every_row(url: &str, env: &[(&'static str, String)], counted: bool) {
    let text = bench(url, env, false);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[1].starts_with("floor: "), "{text}");
    let header = lines
        .iter()
        .position(|l| l.starts_with("TASKS"))
        .unwrap_or_else(|| panic!("no header: {text}"));
    assert!(
        lines[header].contains("FLOOR/S") && lines[header].contains("RATIO"),
        "{text}"
    );
    assert_eq!(lines[header].contains("REQ/OP"), counted, "{text}");
    let rows = &lines[header + 1..];
    assert_eq!(rows.len(), 4, "{text}");
    let columns = if counted { 11 } else { 9 };
    for row in rows {
        // KEYS "one (hot)" is two words.
        let words = row.split_whitespace().count() - usize::from(row.contains("(hot)"));
        assert_eq!(words, columns, "{row}\n{text}");
    }

    let v: Value = serde_json::from_str(&bench(url, env, true)).unwrap();
    assert!(v["floor"].as_str().is_some_and(|f| !f.is_empty()), "{v}");
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4, "{v}");
    for r in runs {
        let rate = r["per_second"].as_f64().unwrap();
        let floor = r["floor"]["per_second"].as_f64().unwrap();
        assert!(rate > 0.0 && floor > 0.0, "{r}");
        assert!(r["floor"]["count"].as_u64() > Some(0), "{r}");
        let ratio = r["ratio"].as_f64().unwrap();
        assert!((ratio - rate / floor).abs() <= 1e-9 * ratio.max(1.0), "{r}");
        if counted {
            // At least one request per cycle or handoff, of leasehold and of the floor.
            assert!(r["requests_per_op"].as_f64() >= Some(1.0), "{r}");
            assert!(r["floor"]["requests_per_op"].as_f64() >= Some(1.0), "{r}");
        } else {
            assert!(r.get("requests_per_op").is_none(), "{r}");
        }
    }
}

#[test]
fn floor_on_the_file_store_and_none_on_record_memory() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    floor_beside_every_row(&url, &[], false);
    // The floor's files are gone: only the lease records stay.
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".floor"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let out = bench("record-memory://", &[], false);
    assert_eq!(
        out,
        "record-memory://: this store has no floor to measure against (--floor)\n"
    );
}

#[test]
fn floor_on_redis() {
    let server = leasehold_testkit::servers::RedisServer::start();
    floor_beside_every_row(&server.url(), &[], false);
}

#[test]
fn floor_on_postgres() {
    let url = leasehold_testkit::servers::shared_postgres().fresh_db();
    floor_beside_every_row(&url, &[], false);
}

#[test]
fn floor_on_etcd() {
    let server = leasehold_testkit::servers::EtcdServer::start();
    let url = format!(
        "{}?prefix=bench/",
        leasehold_testkit::etcd_cluster::store_url(&server)
    );
    floor_beside_every_row(&url, &[], false);
}

#[test]
fn floor_on_kubernetes_leases() {
    let server = leasehold_testkit::servers::ApiServer::start();
    floor_beside_every_row(&server.store_url("bench"), &[], false);
}

#[test]
fn floor_on_s3_with_requests_per_operation() {
    let moto = leasehold_testkit::s3_server::MotoServer::start();
    floor_beside_every_row(&moto.url("bench", "floor"), &moto.env(), true);
}
