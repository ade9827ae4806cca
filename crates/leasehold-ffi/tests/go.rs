//! The Go package (`bindings/go`) against real servers: `go vet` and `go test -race` on a copy of
//! the package linked with this build's `libleasehold.a`, with Redis (and the test kit's proxy in
//! front of it, which the Go tests pause to cut the store off), PostgreSQL, etcd, the Kubernetes
//! Lease API server and the Cloud Storage emulator started here and named in `LEASEHOLD_TEST_*`
//! variables; then a module outside the package that `replace`s its path builds with a plain
//! `go build` and runs, as docs/src/go.md tells a service to do.
//!
//! Needs Go (`go` on the path, or `LEASEHOLD_GO`; the test command installs Debian's
//! `golang-go`) and the `leasehold` command of this build (`cargo build -p leasehold-cli`; a
//! workspace test run builds it).

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use leasehold_testkit::gcs_server::GcsServer;
use leasehold_testkit::newest_modified;
use leasehold_testkit::proxy::TcpProxy;
use leasehold_testkit::servers::{ApiServer, EtcdServer, PostgresServer, RedisServer};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn go() -> PathBuf {
    std::env::var_os("LEASEHOLD_GO")
        .filter(|g| !g.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("go"))
}

/// `libleasehold.a` of this build, beside the test executables (as in `c_smoke.rs`).
fn static_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().unwrap().join("libleasehold.a");
    assert!(
        lib.is_file(),
        "{} is missing: cargo builds it with this test",
        lib.display()
    );
    lib
}

/// The `leasehold` command of this build, failing when it is older than its sources.
fn command() -> PathBuf {
    let bin = leasehold_testkit::workspace_bin("leasehold");
    let built = std::fs::metadata(&bin)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("{}: {e}: run cargo build -p leasehold-cli", bin.display()));
    let sources = newest_modified(&repo().join("crates/leasehold-cli/src"), None)
        .max(newest_modified(&repo().join("crates/leasehold/src"), None));
    assert!(
        built >= sources,
        "{} is older than its sources: run cargo build -p leasehold-cli",
        bin.display()
    );
    bin
}

/// Copies the package's sources (not `lib/`) to `to`, and this build's library and header into
/// `to/lib`, where the package's `#cgo` lines look.
fn copy_package(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let (path, name) = (e.path(), e.file_name());
        if name == "lib" {
            continue;
        }
        if path.is_dir() {
            copy_package(&path, &to.join(&name));
        } else {
            std::fs::copy(&path, to.join(&name)).unwrap();
        }
    }
}

fn go_cmd(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(go());
    cmd.current_dir(dir)
        .args(args)
        // Nothing is downloaded: the package uses the standard library only.
        .env("GOPROXY", "off")
        .env("GOFLAGS", "-mod=mod")
        .env("GOTOOLCHAIN", "local")
        .env("CGO_ENABLED", "1");
    cmd
}

fn run(mut cmd: Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what} ({:?}): {e}: install Go (apt-get install golang-go) or set LEASEHOLD_GO", go()));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{what} failed: {}", out.status);
    stdout
}

#[test]
fn go_package_passes_its_tests_against_real_servers() {
    let cli = command();
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("leasehold-go");
    copy_package(&repo().join("bindings/go"), &pkg);
    std::fs::create_dir_all(pkg.join("lib")).unwrap();
    std::fs::copy(static_library(), pkg.join("lib/libleasehold.a")).unwrap();
    std::fs::copy(
        repo().join("crates/leasehold-ffi/include/leasehold.h"),
        pkg.join("lib/leasehold.h"),
    )
    .unwrap();

    run(go_cmd(&pkg, &["vet", "./..."]), "go vet");
    let goroot = run(go_cmd(&pkg, &["env", "GOROOT"]), "go env");
    let mut gofmt = Command::new(Path::new(goroot.trim()).join("bin/gofmt"));
    gofmt.current_dir(&pkg).args(["-l", "."]);
    let unformatted = run(gofmt, "gofmt");
    assert!(
        unformatted.trim().is_empty(),
        "gofmt would change: {unformatted}"
    );

    let redis = RedisServer::start();
    let proxy = Arc::new(TcpProxy::start(redis.port));
    let control = proxy.serve_control();
    let etcd = EtcdServer::start();
    let api = ApiServer::start();
    let gcs = GcsServer::start();
    let pg = PostgresServer::start();
    let mut test = go_cmd(
        &pkg,
        &["test", "-race", "-count=1", "-timeout=20m", "./..."],
    );
    test.env("LEASEHOLD_TEST_REQUIRE_ALL", "1")
        .env("LEASEHOLD_TEST_REDIS", redis.url())
        .env(
            "LEASEHOLD_TEST_REDIS_PROXIED",
            format!("redis://127.0.0.1:{}", proxy.port),
        )
        .env("LEASEHOLD_TEST_PROXY", format!("127.0.0.1:{control}"))
        .env("LEASEHOLD_TEST_POSTGRES", pg.fresh_db())
        .env(
            "LEASEHOLD_TEST_ETCD",
            format!("etcd://127.0.0.1:{}", etcd.port),
        )
        .env("LEASEHOLD_TEST_K8S", api.store_url("go"))
        .env("LEASEHOLD_TEST_GCS", gcs.store_url("go"))
        .env("LEASEHOLD_CLI", &cli);
    let out = run(test, "go test -race");
    assert!(!out.contains("SKIP"), "no Go test may be skipped:\n{out}");

    // A service's own module, outside the package, that replaces the module path with it.
    let svc = dir.path().join("service");
    std::fs::create_dir_all(&svc).unwrap();
    std::fs::write(
        svc.join("go.mod"),
        format!(
            "module example.com/service\n\ngo 1.19\n\nrequire leasehold.dev/leasehold v0.0.0\n\n\
             replace leasehold.dev/leasehold => {}\n",
            pkg.display()
        ),
    )
    .unwrap();
    std::fs::write(
        svc.join("main.go"),
        r#"package main

import (
	"context"
	"fmt"
	"os"

	"leasehold.dev/leasehold"
)

func main() {
	ctx := context.Background()
	locks, err := leasehold.Connect(ctx, os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer locks.Close()
	lease, err := locks.Lock("service").Acquire(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("fence", lease.Fence())
	if err := lease.Release(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
"#,
    )
    .unwrap();
    run(go_cmd(&svc, &["build", "-o", "service", "."]), "go build");
    let store = format!("file://{}", dir.path().join("locks").display());
    let mut service = Command::new(svc.join("service"));
    service.arg(&store);
    let out = run(service, "the service");
    let fence = out.trim().strip_prefix("fence ").map(str::parse::<u64>);
    assert!(
        matches!(fence, Some(Ok(f)) if f > 0),
        "the service printed {out:?}"
    );
}
