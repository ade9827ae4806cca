//! `leasehold torture` with real processes: it finds violations where nothing excludes (each
//! client on a memory store of its own, through the library or `leasehold run`) and none on the
//! file store and on a private Redis (no fault, SIGKILL, SIGSTOP; on Redis also clients cut off
//! from it by the `partition` fault's proxies; on Redis and PostgreSQL, locks and semaphores,
//! grants whose answers were lost before their holder was cut off: `lost-answer`), none with
//! clients' wall clocks two minutes off
//! (`clock`) on the file store and on Cloud Storage (fake-gcs-server, a record-adapter store, also
//! partitioned); every other store, its servers started by the command, keeps what it promises
//! under kills and restarts (etcd also with a member partitioned from its peers; S3 on moto
//! behind a serialising proxy; Azure also partitioned), and what it does not promise (Redis
//! restarted empty, an asynchronous Sentinel failover) is counted apart.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

/// Runs `leasehold torture ARGS --json`: its exit status and its rows by fault.
fn torture(args: &[&str]) -> (i32, Vec<serde_json::Value>) {
    let (code, rows, _) = torture_saying(args, vec![]);
    (code, rows)
}

/// [`torture`] with `env` added to the command's environment: also what it said on stderr.
fn torture_saying(
    args: &[&str],
    env: Vec<(&str, String)>,
) -> (i32, Vec<serde_json::Value>, String) {
    let mut cmd = Command::new(BIN);
    if args.first() == Some(&"k8s") {
        // The API server the k8s kind starts, built from the workspace.
        cmd.env(
            "LEASEHOLD_APISERVER",
            leasehold_testkit::servers::apiserver_bin(),
        );
    }
    let out = cmd
        .arg("torture")
        .args(args)
        .arg("--json")
        .envs(env)
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
        String::from_utf8_lossy(&out.stderr).into_owned(),
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

/// Semaphores and read-write locks: on the memory store (each client's permits its own) more
/// than N clients inside a semaphore of N, and a writer beside others, are caught.
#[test]
fn the_checker_catches_permits_that_nothing_limits() {
    for (mode, name) in [
        (&["--permits", "2"][..], "semaphore:2"),
        (&["--read-write"][..], "read-write"),
    ] {
        let mut args = vec!["memory", "--duration", "3s", "--faults", "none"];
        args.extend(["--keys", "1", "--clients", "4"]);
        args.extend(mode);
        let (code, rows) = torture(&args);
        assert_eq!(code, 1, "{mode:?}: {rows:?}");
        assert_eq!(rows[0]["mode"], name, "{rows:?}");
        assert!(n(&rows[0], "overlaps") > 0, "{mode:?}: {rows:?}");
    }
}

/// The file store keeps semaphores to their permits and read-write locks to one writer (or
/// readers), with rising fences, under kills and pauses, through the library and `leasehold run`.
#[test]
fn the_file_store_keeps_permits_under_kills_and_pauses() {
    for (mode, seed) in [
        (&["--permits", "2"][..], "13"),
        (&["--read-write"][..], "14"),
    ] {
        let mut args = vec![
            "file",
            "--duration",
            "9s",
            "--faults",
            "none,kill,stop,clock",
        ];
        args.extend(["--seed", seed]);
        args.extend(mode);
        let (code, rows) = torture(&args);
        assert_eq!(code, 0, "{mode:?}: {rows:?}");
        assert_eq!(rows.len(), 4);
        for row in &rows {
            assert!(n(row, "sections") > 0, "{mode:?}: {row}");
            assert_eq!(
                (n(row, "overlaps"), n(row, "fence_violations")),
                (0, 0),
                "{mode:?}: {row}"
            );
        }
        assert!(
            rows[1..].iter().all(|r| n(r, "faults_injected") > 0),
            "{rows:?}"
        );
    }
}

/// A semaphore with no more permits than clients checks nothing: refused, exit 2.
#[test]
fn permits_must_be_fewer_than_clients() {
    for args in [
        &["--permits", "5"][..],
        &["--permits", "2", "--clients", "2"],
        &["--read-write", "--clients", "1"],
        &["--permits", "0"],
    ] {
        let out = Command::new(BIN)
            .args(["torture", "file", "--duration", "1s"])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

/// A store the command cannot open is said once, with exit status 2, before any client starts
/// (not one error per client and a table of empty phases).
#[test]
fn a_store_that_cannot_be_opened_is_said_once_before_any_client_starts() {
    let out = Command::new(BIN)
        .args([
            "torture",
            "unusable",
            "--store",
            "nosuch://x",
            "--duration",
            "1s",
        ])
        .args(["--faults", "none,kill", "--clients", "4"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.matches("nosuch").count(), 1, "said once: {err}");
    assert!(err.contains("cannot open"), "{err}");
    assert!(!err.contains("client"), "no client started: {err}");
    assert!(
        out.stdout.is_empty(),
        "no table: {}",
        String::from_utf8_lossy(&out.stdout)
    );
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
    kept_under_faults(code, &rows);
}

/// Asserts a run kept its promises: exit 0, and every row with sections, faults injected, no
/// overlap and no fence violation.
/// A phase's row that ran sections under injected faults with no overlap and no fence
/// violation; `context` goes into the failure message.
fn row_kept(row: &serde_json::Value, context: &str) {
    assert!(
        n(row, "sections") > 0 && n(row, "faults_injected") > 0,
        "{row} {context}"
    );
    assert_eq!(
        (n(row, "overlaps"), n(row, "fence_violations")),
        (0, 0),
        "{row} {context}"
    );
}

fn kept_under_faults(code: i32, rows: &[serde_json::Value]) {
    assert_eq!(code, 0, "{rows:?}");
    assert!(!rows.is_empty());
    for row in rows {
        row_kept(row, "");
    }
}

/// Semaphores and read-write locks keep their promises on the stores that hold them by their own
/// rules on a server (Redis scripts, PostgreSQL statements, etcd transactions), under kills and a
/// restart of the server.
#[test]
fn server_side_permits_keep_their_promises_under_kills_and_restarts() {
    for (kind, seed) in [("redis", "31"), ("postgres", "32"), ("etcd", "33")] {
        for mode in [&["--permits", "2"][..], &["--read-write"][..]] {
            let mut args = vec![kind, "--duration", "5s", "--faults", "kill,restart"];
            args.extend(["--seed", seed]);
            args.extend(mode);
            let (code, rows) = torture(&args);
            assert_eq!(code, 0, "{kind} {mode:?}: {rows:?}");
            assert_eq!(rows.len(), 2, "{kind} {mode:?}: {rows:?}");
            for row in &rows {
                assert!(n(row, "sections") > 0, "{kind} {mode:?}: {row}");
                assert_eq!(
                    (n(row, "overlaps"), n(row, "fence_violations")),
                    (0, 0),
                    "{kind} {mode:?}: {row}"
                );
            }
        }
    }
}

/// Runs `leasehold torture KIND` with `faults` for `duration` (seed fixed): exit 0, every row
/// with critical sections (or, where the store promises no fences, grants the fence caught),
/// every faulty row with faults injected, and no overlap or fence violation where the store
/// promises exclusion and fences (unpromised ones are counted apart and leave the status alone).
fn keeps_its_promises(
    kind: &str,
    faults: &str,
    duration: &str,
    seed: &str,
) -> Vec<serde_json::Value> {
    let (code, rows) = torture(&[
        kind,
        "--duration",
        duration,
        "--faults",
        faults,
        "--seed",
        seed,
    ]);
    assert_eq!(code, 0, "{kind}: {rows:?}");
    assert_eq!(rows.len(), faults.split(',').count(), "{rows:?}");
    for row in &rows {
        assert_eq!(row["store"], kind, "{row}");
        assert!(
            n(row, "sections") > 0 || n(row, "unpromised_fence_violations") > 0,
            "{row}"
        );
        if row["fault"] != "none" {
            assert!(n(row, "faults_injected") > 0, "{row}");
        }
        assert_eq!(
            (n(row, "overlaps"), n(row, "fence_violations")),
            (0, 0),
            "{row}"
        );
    }
    rows
}

#[test]
fn redis_keeps_exclusion_and_fences_when_clients_are_cut_off() {
    let (code, rows) = torture(&[
        "redis",
        "--duration",
        "8s",
        "--faults",
        "partition",
        "--seed",
        "13",
    ]);
    kept_under_faults(code, &rows);
}

#[test]
fn the_file_store_is_immune_to_skewed_wall_clocks() {
    let (code, rows) = torture(&[
        "file",
        "--duration",
        "5s",
        "--faults",
        "clock",
        "--seed",
        "14",
    ]);
    kept_under_faults(code, &rows);
}

#[test]
fn a_record_store_keeps_exclusion_and_fences_with_skewed_wall_clocks_and_when_cut_off() {
    // Cloud Storage objects (fake-gcs-server): the record adapter, which judges expiry by what
    // it observes, never by the clients' wall clocks; partitioned through its `endpoint=`.
    let gcs = leasehold_testkit::gcs_server::GcsServer::start();
    let url = gcs.store_url("torture-clock");
    let (code, rows) = torture(&[
        "gcs",
        "--store",
        &url,
        "--duration",
        "10s",
        "--faults",
        "clock,partition",
        "--seed",
        "15",
    ]);
    kept_under_faults(code, &rows);
}

#[test]
fn partition_and_lost_answers_are_refused_where_there_is_no_network_to_cut() {
    for fault in ["partition", "lost-answer"] {
        for store in ["file", "memory"] {
            let out = Command::new(BIN)
                .args(["torture", store, "--faults", fault, "--duration", "1s"])
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{fault} {store}: {err}");
            assert!(
                err.contains(&format!("{fault} needs a store reached over TCP")),
                "{err}"
            );
            assert!(!err.contains("panicked"), "{err}");
        }
    }
}

/// `lost-answer` on `kind`, with locks and with a semaphore of one permit, on one key: the
/// store's answers to the waiting clients (or to all) lost while their requests are applied and
/// the holders leave, so that the next grant is one whose answer is lost; their connections
/// reset (they send again what they sent); the first of them to enter then cut off from the
/// store for 1.5 TTL. A store that answers the repeated request with the grant as it stood, its
/// expiry counted from the first request while the client counts from the repeat, leaves the
/// cut-off holder inside, valid by its own clock, when the next client is granted the key: an
/// overlap. Asserts none, and that the fault cut a client off after lost answers.
fn keeps_exclusion_when_answers_are_lost(kind: &str, seed: &str) {
    for mode in [&[][..], &["--permits", "1"][..]] {
        let mut args = vec![kind, "--duration", "12s", "--faults", "lost-answer"];
        args.extend(["--keys", "1", "--seed", seed]);
        args.extend(mode);
        let (code, rows, said) = torture_saying(&args, vec![]);
        assert_eq!(code, 0, "{kind} {mode:?}: {rows:?}\n{said}");
        assert_eq!(rows.len(), 1, "{rows:?}");
        let row = &rows[0];
        row_kept(row, &format!("{kind} {mode:?}: {said}"));
        let cut: u64 = said
            .lines()
            .find_map(|l| l.strip_prefix("leasehold torture: lost-answer: after "))
            .and_then(|l| l.split(' ').next())
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("no count of clients cut off: {said}"));
        assert!(cut > 0, "{kind} {mode:?}: {said}");
    }
}

#[test]
fn redis_keeps_exclusion_when_answers_are_lost() {
    keeps_exclusion_when_answers_are_lost("redis", "41");
}

#[test]
fn postgres_keeps_exclusion_when_answers_are_lost() {
    keeps_exclusion_when_answers_are_lost("postgres", "42");
}

#[test]
fn redis_restarted_empty_is_shown_as_caught_by_the_fence() {
    // A server without persistence restarted empty forgets leases and fence counters: that is
    // not promised, so what it causes is counted apart and the run passes.
    let rows = keeps_its_promises("redis", "none,restart", "4s", "21");
    assert_eq!(rows[1]["promised"]["fences"], false, "{rows:?}");
    assert_eq!(rows[0]["promised"]["fences"], true, "{rows:?}");
}

#[test]
fn redis_sentinel_keeps_its_promises_under_kills_and_failovers() {
    let rows = keeps_its_promises("redis-sentinel", "kill,restart", "6s", "22");
    assert_eq!(rows[1]["promised"]["exclusion"], false, "{rows:?}");
}

#[test]
fn redis_cluster_keeps_its_promises_under_kills_and_failovers() {
    keeps_its_promises("redis-cluster", "kill,restart", "6s", "23");
}

#[test]
fn redlock_keeps_its_promises_with_one_node_restarted_empty() {
    keeps_its_promises("redlock", "stop,restart", "6s", "24");
}

#[test]
fn etcd_keeps_its_promises_when_its_leader_is_killed_or_a_member_partitioned() {
    // Restart first: a leader change renews every etcd lease, so under leader restarts the
    // sessions of clients killed in an earlier phase never expire and their keys stay held.
    // With partition among the faults the members talk through the run's peer proxies, across
    // the leader's restarts too; the seed's first partition cut black-holes member m2 from its
    // peers. Each phase runs 7 s: a leader change (restart, partition) renews every etcd lease,
    // so the keys of clients killed around it stay held for seconds into the next phase (a kill
    // phase of 3 s once ran no section at all, and a partition phase of 5 s once none, beside
    // the other torture tests).
    let (code, rows, said) = torture_saying(
        &[
            "etcd",
            "--duration",
            "21s",
            "--faults",
            "restart,partition,kill",
            "--seed",
            "61",
        ],
        vec![],
    );
    assert_eq!(code, 0, "{rows:?}\n{said}");
    for row in &rows {
        assert!(n(row, "sections") > 0, "{row}");
        assert!(n(row, "faults_injected") > 0, "{row}");
        assert_eq!(
            (n(row, "overlaps"), n(row, "fence_violations")),
            (0, 0),
            "{row}"
        );
    }
    let cuts = said
        .lines()
        .find_map(|l| l.strip_prefix("leasehold torture: partition: "))
        .unwrap_or_else(|| panic!("no count of member cuts: {said}"));
    let members: u64 = cuts.split(' ').next().unwrap().parse().unwrap();
    assert!(members > 0, "{said}");
}

#[test]
fn postgres_keeps_its_promises_across_a_restart() {
    keeps_its_promises("postgres", "kill,restart", "6s", "26");
}

#[test]
fn kubernetes_keeps_its_promises_across_an_api_server_restart() {
    keeps_its_promises("k8s", "kill,restart", "6s", "27");
}

#[test]
fn gcs_keeps_its_promises_through_a_hung_emulator() {
    keeps_its_promises("gcs", "kill,restart", "5s", "28");
}

#[test]
fn s3_keeps_its_promises_on_moto_behind_a_serialising_proxy() {
    // The run starts moto behind the test kit's serialising proxy: moto alone checks a
    // conditional PUT and writes it in two steps, which the proxy makes one.
    keeps_its_promises("s3", "kill,restart", "5s", "29");
}

#[test]
fn s3_runs_on_plain_moto() {
    // A smoke run: moto without the proxy can accept two concurrent PUTs conditioned on the same
    // ETag, which S3 refuses, so no promise is asserted here: the kind runs on a plain moto
    // given with --store, with its faults, and clients enter.
    let moto = leasehold_testkit::s3_server::MotoServer::start();
    let url = moto.url("plain", "torture/");
    let args = [
        "s3",
        "--store",
        &url,
        "--duration",
        "4s",
        "--faults",
        "none,kill",
    ];
    let (_, rows, _) = torture_saying(&[&args[..], &["--seed", "32"]].concat(), moto.env());
    assert_eq!(rows.len(), 2, "{rows:?}");
    for row in &rows {
        assert!(n(row, "sections") > 0, "{row}");
    }
    assert!(n(&rows[1], "faults_injected") > 0, "{rows:?}");
}

#[test]
fn azure_keeps_its_promises_through_a_hung_emulator_and_when_cut_off() {
    // Azurite's endpoint is in the run's store URL (`?endpoint=`), so partition proxies it.
    keeps_its_promises("azure", "kill,restart,partition", "8s", "30");
}

/// `torture k8s` runs no cargo: without a `leasehold-apiserver` to run, it says how to install one.
#[test]
fn a_missing_api_server_says_how_to_install_it() {
    let out = Command::new(BIN)
        .args(["torture", "k8s", "--duration", "1s"])
        .env("LEASEHOLD_APISERVER", "/nonexistent/leasehold-apiserver")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot start leasehold-apiserver")
            && err.contains("cargo install leasehold-apiserver")
            && err.contains("--store URL"),
        "{err}"
    );
}

#[test]
fn a_server_that_cannot_start_is_an_error_naming_it_and_a_restart_needs_one() {
    let out = Command::new(BIN)
        .args(["torture", "azure", "--duration", "1s"])
        .env("LEASEHOLD_AZURITE", "/nonexistent/azurite-blob")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot start Azurite") && err.contains("LEASEHOLD_AZURITE"),
        "{err}"
    );
    assert!(
        err.contains("--store URL") && !err.contains("panicked"),
        "{err}"
    );
    let out = Command::new(BIN)
        .args(["torture", "file", "--faults", "none,restart"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("restart fault needs a server"), "{err}");
}

/// On a terminal a run shows how each phase goes (fault, time, sections, faults, violations);
/// piped, it prints only its table.
#[test]
fn a_run_shows_its_progress_on_a_terminal_only() {
    let args = "torture file --duration 3s --faults none";
    let piped = Command::new(BIN).args(args.split(' ')).output().unwrap();
    let err = String::from_utf8_lossy(&piped.stderr);
    assert_eq!(piped.status.code(), Some(0), "{err}");
    assert!(!err.contains(" sections,"), "piped: {err}");
    // `script` (util-linux) gives the command a terminal.
    let tty = Command::new("script")
        .args(["-qec", &format!("{BIN} {args}"), "/dev/null"])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&tty.stdout);
    assert_eq!(tty.status.code(), Some(0), "{shown}");
    // The phase's bar: its fault, seconds done of the phase's, and the counts so far.
    assert!(
        shown.contains("none [")
            && shown.contains("/3s  ")
            && shown.contains(" sections, ")
            && shown.contains(" fence violations"),
        "{shown}"
    );
}
