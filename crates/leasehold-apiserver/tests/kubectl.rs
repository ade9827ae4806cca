//! `kubectl` (an independent client) against leasehold-apiserver over a real etcd: create, get -o
//! yaml, describe, replace with a stale resourceVersion (conflict), delete, get --watch.
//!
//! The server publishes no OpenAPI document, so `create` and `replace` run with
//! `--validate=false` (kubectl's client-side schema validation needs one; the server validates).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold_testkit::servers::ApiServer;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

struct Kubectl {
    config: PathBuf,
    dir: tempfile::TempDir,
}

impl Kubectl {
    fn new(s: &ApiServer, ns: &str) -> Self {
        Kubectl {
            config: s.kubeconfig(ns),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new("kubectl");
        c.env("KUBECONFIG", &self.config)
            .env("HOME", self.dir.path())
            .arg("--request-timeout=20s");
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().unwrap_or_else(|e| {
            panic!("cannot run kubectl ({e}): apt-get install kubernetes-client")
        })
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn file(&self, name: &str, text: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    }
}

const LEASE: &str = "apiVersion: coordination.k8s.io/v1
kind: Lease
metadata:
  name: task-llm-demo
  labels:
    app.kubernetes.io/managed-by: leasehold
  annotations:
    leasehold.io/fence: \"42\"
spec:
  holderIdentity: pod-a
  leaseDurationSeconds: 15
  acquireTime: \"2026-01-01T10:00:00.000000Z\"
  renewTime: \"2026-01-01T10:00:05.000000Z\"
  leaseTransitions: 2
";

fn yaml_field<'a>(yaml: &'a str, field: &str) -> Option<&'a str> {
    yaml.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{field}: ")))
        .map(|v| v.trim_matches('"').trim_matches('\''))
}

#[test]
fn kubectl_create_get_describe_replace_delete_watch() {
    let s = ApiServer::start();
    let k = Kubectl::new(&s, "demo");
    let file = k.file("lease.yaml", LEASE);

    let out = k.ok(&["create", "--validate=false", "-f", &file]);
    assert!(
        out.contains("lease.coordination.k8s.io/task-llm-demo created"),
        "{out}"
    );
    let dup = k.run(&["create", "--validate=false", "-f", &file]);
    assert!(!dup.status.success());
    let err = String::from_utf8_lossy(&dup.stderr);
    assert!(
        err.contains("AlreadyExists") && err.contains("already exists"),
        "{err}"
    );

    // get --watch: kubectl prints the lease, then one line per change.
    let mut watch = k
        .cmd()
        .args(["get", "lease", "task-llm-demo", "--watch", "-o", "custom-columns=NAME:.metadata.name,HOLDER:.spec.holderIdentity,RV:.metadata.resourceVersion", "--no-headers"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("kubectl");
    let yaml = k.ok(&["get", "lease", "task-llm-demo", "-o", "yaml"]);
    assert_eq!(yaml_field(&yaml, "holderIdentity"), Some("pod-a"), "{yaml}");
    assert_eq!(yaml_field(&yaml, "namespace"), Some("demo"), "{yaml}");
    assert_eq!(
        yaml_field(&yaml, "leasehold.io/fence"),
        Some("42"),
        "{yaml}"
    );
    let rv1 = yaml_field(&yaml, "resourceVersion").unwrap().to_owned();
    assert!(yaml_field(&yaml, "uid").is_some() && yaml_field(&yaml, "creationTimestamp").is_some());

    // Server-side printing: the columns a real cluster shows for Leases.
    let listing = k.ok(&["get", "leases"]);
    let mut rows = listing.lines();
    let head: Vec<&str> = rows.next().unwrap().split_whitespace().collect();
    assert_eq!(head, ["NAME", "HOLDER", "AGE"], "{listing}");
    let row: Vec<&str> = rows.next().unwrap().split_whitespace().collect();
    assert_eq!(row[..2], ["task-llm-demo", "pod-a"], "{listing}");

    let described = k.ok(&["describe", "lease", "task-llm-demo"]);
    for want in [
        "Name:",
        "task-llm-demo",
        "Namespace:",
        "demo",
        "Holder Identity:",
        "pod-a",
        "Lease Duration Seconds:",
        "15",
        "Lease Transitions:",
        "2",
    ] {
        assert!(
            described.contains(want),
            "describe lacks {want:?}:\n{described}"
        );
    }

    // A replace that carries the current resourceVersion succeeds …
    let v2 = yaml.replace("holderIdentity: pod-a", "holderIdentity: pod-b");
    let f2 = k.file("v2.yaml", &v2);
    let out = k.ok(&["replace", "--validate=false", "-f", &f2]);
    assert!(out.contains("replaced"), "{out}");
    // … the same stale one again is a conflict.
    let v3 = yaml.replace("holderIdentity: pod-a", "holderIdentity: pod-c");
    let f3 = k.file("v3.yaml", &v3);
    let stale = k.run(&["replace", "--validate=false", "-f", &f3]);
    assert!(!stale.status.success(), "stale replace succeeded");
    let err = String::from_utf8_lossy(&stale.stderr);
    assert!(
        err.contains("the object has been modified") || err.contains("Conflict"),
        "{err}"
    );
    let yaml = k.ok(&["get", "lease", "task-llm-demo", "-o", "yaml"]);
    assert_eq!(yaml_field(&yaml, "holderIdentity"), Some("pod-b"));
    assert_ne!(yaml_field(&yaml, "resourceVersion"), Some(rv1.as_str()));

    let out = k.ok(&["delete", "lease", "task-llm-demo"]);
    assert!(out.contains("deleted"), "{out}");
    let gone = k.run(&["get", "lease", "task-llm-demo"]);
    assert!(!gone.status.success());
    assert!(String::from_utf8_lossy(&gone.stderr).contains("NotFound"));

    // The watcher saw the creation and the replacement (then the deletion ends its object).
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    while let Some(Ok(line)) = lines.next() {
        seen.push(line.clone());
        if line.contains("pod-b") {
            break;
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(seen.iter().any(|l| l.contains("pod-a")), "{seen:?}");
    assert!(seen.iter().any(|l| l.contains("pod-b")), "{seen:?}");
}
