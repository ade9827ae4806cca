//! Release checks that need no server: the `rust-version` the crates declare is true of every
//! dependency they build with.
//!
//! (That every crate meant for users packages, offline, is a step of `./scripts/test`: `cargo
//! package` runs its own builds.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::process::Command;

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// `1.88` or `1.88.0` as comparable numbers.
fn version(v: &str) -> Vec<u64> {
    let mut parts: Vec<u64> = v.split('.').map(|p| p.parse().unwrap_or(0)).collect();
    parts.resize(3, 0);
    parts
}

fn host() -> String {
    let out = Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("rustc -vV runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .to_string()
}

/// Every package the workspace's publishable crates build with (normal and build dependencies,
/// on this host), as (name, version, rust-version), and the crates' own declared rust-versions.
/// A dependency: name, version, rust-version.
type Dep = (String, String, String);
/// A workspace crate: name, rust-version.
type Member = (String, String);

fn metadata() -> (Vec<Dep>, Vec<Member>) {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml");
    let out = Command::new(cargo())
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .args(["--filter-platform", &host(), "--manifest-path", root])
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
    let packages: HashMap<&str, &Value> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| (p["id"].as_str().expect("package id"), p))
        .collect();
    let members: Vec<&str> = meta["workspace_members"]
        .as_array()
        .expect("workspace members")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let publishable: Vec<&str> = members
        .iter()
        .copied()
        .filter(|id| {
            // `publish = false` reads as an empty list of registries.
            packages[id]["publish"]
                .as_array()
                .is_none_or(|r| !r.is_empty())
        })
        .collect();
    let nodes: HashMap<&str, &Value> = meta["resolve"]["nodes"]
        .as_array()
        .expect("resolve nodes")
        .iter()
        .map(|n| (n["id"].as_str().expect("node id"), n))
        .collect();
    let mut seen: HashSet<&str> = HashSet::new();
    let mut todo: Vec<&str> = publishable.clone();
    while let Some(id) = todo.pop() {
        if !seen.insert(id) {
            continue;
        }
        for dep in nodes[id]["deps"].as_array().into_iter().flatten() {
            let used = dep["dep_kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| k["kind"].as_str() != Some("dev"));
            if used {
                todo.push(dep["pkg"].as_str().expect("dep id"));
            }
        }
    }
    let deps = seen
        .iter()
        .filter(|id| !members.contains(id))
        .map(|id| {
            let p = packages[id];
            let s = |f: &str| p[f].as_str().unwrap_or_default().to_string();
            (s("name"), s("version"), s("rust_version"))
        })
        .collect();
    let declared = members
        .iter()
        .map(|id| {
            let p = packages[id];
            let s = |f: &str| p[f].as_str().unwrap_or_default().to_string();
            (s("name"), s("rust_version"))
        })
        .collect();
    (deps, declared)
}

#[test]
fn rust_version_is_at_least_every_dependencys() {
    let (deps, declared) = metadata();
    let ours: HashSet<&str> = declared.iter().map(|(_, v)| v.as_str()).collect();
    assert_eq!(
        ours.len(),
        1,
        "the workspace's crates declare different rust-versions: {declared:?}"
    );
    let ours = declared[0].1.clone();
    assert!(!ours.is_empty(), "the crates declare no rust-version");
    let mut higher: Vec<String> = deps
        .iter()
        .filter(|(_, _, rv)| !rv.is_empty() && version(rv) > version(&ours))
        .map(|(n, v, rv)| format!("{n} {v} needs {rv}"))
        .collect();
    higher.sort();
    assert!(
        higher.is_empty(),
        "rust-version {ours} is below what dependencies need (raise it in the workspace's \
         Cargo.toml, or pin them lower): {higher:?}"
    );
}
