//! The Python package's tests (`bindings/python/tests`, pytest) against real servers: Redis (and
//! a proxy in front of it that the tests pause to cut the store off), the Kubernetes Lease API
//! server, the Cloud Storage emulator and PostgreSQL, started here and named to pytest in
//! `LEASEHOLD_TEST_*` variables.
//!
//! The package must be installed in `LEASEHOLD_PYTHON`'s venv, built from these sources
//! (`scripts/python-package` does both; the test command runs it first). A run that executed no
//! test, skipped one, or had one fail, fails here.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use leasehold_testkit::foreign::python;
use leasehold_testkit::gcs_server::GcsServer;
use leasehold_testkit::newest_modified;
use leasehold_testkit::proxy::TcpProxy;
use leasehold_testkit::servers::{ApiServer, PostgresServer, RedisServer};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::SystemTime;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Fails, saying what to run, when the installed package's extension is older than the Rust
/// sources it is built from.
fn check_installed(python: &Path) {
    let out = Command::new(python)
        .args([
            "-c",
            "import leasehold._native as n, os; print(os.path.getmtime(n.__file__))",
        ])
        .output()
        .expect("run python");
    let text = String::from_utf8_lossy(&out.stdout);
    let built: f64 = text.trim().parse().unwrap_or_else(|_| {
        panic!(
            "the leasehold Python package is not installed in {} ({}): run scripts/python-package",
            python.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )
    });
    let sources = newest_modified(&repo().join("bindings/python/src"), Some("rs"))
        .max(newest_modified(
            &repo().join("crates/leasehold/src"),
            Some("rs"),
        ))
        .max(newest_modified(
            &repo().join("crates/leasehold/src"),
            Some("lua"),
        ));
    let sources = sources
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    assert!(
        built + 1.0 >= sources,
        "the installed leasehold Python package is older than its Rust sources: run \
         scripts/python-package"
    );
}

/// The value of `attr="N"` in the first element of `xml` that has it.
fn count(xml: &str, attr: &str) -> u64 {
    let pat = format!(" {attr}=\"");
    xml.find(&pat)
        .and_then(|i| {
            let rest = &xml[i + pat.len()..];
            rest[..rest.find('"')?].parse().ok()
        })
        .unwrap_or_else(|| panic!("no {attr} in the pytest report: {xml:.400}"))
}

#[test]
fn python_package_passes_its_tests_against_real_servers() {
    let python = python();
    check_installed(&python);
    let redis = RedisServer::start();
    let proxy = Arc::new(TcpProxy::start(redis.port));
    let control = proxy.serve_control();
    let api = ApiServer::start();
    let gcs = GcsServer::start();
    let pg = PostgresServer::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let report = dir.path().join("report.xml");
    let out = Command::new(&python)
        .current_dir(repo().join("bindings/python"))
        .args(["-m", "pytest", "-p", "no:cacheprovider", "-q", "-ra"])
        .arg(format!("--junitxml={}", report.display()))
        .arg("tests")
        .env("LEASEHOLD_TEST_REDIS", redis.url())
        .env(
            "LEASEHOLD_TEST_REDIS_PROXIED",
            format!("redis://127.0.0.1:{}", proxy.port),
        )
        .env("LEASEHOLD_TEST_PROXY", format!("127.0.0.1:{control}"))
        .env("LEASEHOLD_TEST_K8S", api.store_url("python"))
        .env("LEASEHOLD_TEST_GCS", gcs.store_url("python"))
        .env("LEASEHOLD_TEST_GCS_EMULATOR", gcs.url())
        .env("LEASEHOLD_TEST_POSTGRES", pg.fresh_db())
        .env("LEASEHOLD_CLI", env!("CARGO_BIN_EXE_leasehold"))
        .output()
        .expect("run pytest");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(out.status.success(), "pytest failed: {}", out.status);
    let xml = std::fs::read_to_string(&report).expect("the pytest report");
    let (tests, skipped) = (count(&xml, "tests"), count(&xml, "skipped"));
    let (failures, errors) = (count(&xml, "failures"), count(&xml, "errors"));
    assert!(tests > 0, "pytest ran no test");
    assert_eq!(
        (skipped, failures, errors),
        (0, 0, 0),
        "no test may be skipped, fail or err"
    );
}
