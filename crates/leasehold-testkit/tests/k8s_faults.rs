//! Kubernetes-Lease-specific behaviour against leasehold-apiserver over a real etcd: an operator's
//! `kubectl delete lease`, corrupt annotations, a verb RBAC does not grant, an unreachable server,
//! Leases of other clients (client-go leader election), and names for hostile keys.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::{Error, Inspection, LostReason};
use leasehold_testkit::servers::{free_port, http_request, shared_apiserver, ApiServer};
use serde_json::{json, Value};
use std::time::Duration;

const MS: Duration = Duration::from_millis(1);

fn lease_path(ns: &str, name: &str) -> String {
    format!("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}")
}

fn get_lease(s: &ApiServer, ns: &str, name: &str) -> (u16, Value) {
    let (c, b) = http_request(s.port, "GET", &lease_path(ns, name), &[], "").unwrap();
    (c, serde_json::from_str(&b).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_delete_fires_lost_and_the_lease_shows_holder_and_fence() {
    let s = shared_apiserver();
    let url = format!("{}&prefix=task-llm-", s.store_url("faults"));
    let l = leasehold_testkit::connect_as(&url, "pod-a").await;
    let g = l
        .lock("Delete/Me")
        .unwrap()
        .ttl(900 * MS)
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    let name = "task-llm-delete-me--".to_owned();
    let list = http_request(
        s.port,
        "GET",
        "/apis/coordination.k8s.io/v1/namespaces/faults/leases",
        &[],
        "",
    )
    .unwrap()
    .1;
    let list: Value = serde_json::from_str(&list).unwrap();
    let lease = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["metadata"]["name"].as_str().unwrap().starts_with(&name))
        .unwrap_or_else(|| panic!("{list}"))
        .clone();
    let name = lease["metadata"]["name"].as_str().unwrap().to_owned();
    assert!(name.len() <= 63);
    assert_eq!(lease["spec"]["holderIdentity"], "pod-a");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 1);
    assert_eq!(
        lease["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "leasehold"
    );
    assert_eq!(
        lease["metadata"]["annotations"]["leasehold.io/key"],
        "Delete/Me"
    );
    assert_eq!(
        lease["metadata"]["annotations"]["leasehold.io/fence"],
        g.fence().to_string()
    );

    let out = std::process::Command::new("kubectl")
        .env("KUBECONFIG", s.kubeconfig("faults"))
        .args(["delete", "lease", &name])
        .output()
        .expect("kubectl");
    assert!(out.status.success(), "{out:?}");
    let reason = tokio::time::timeout(Duration::from_secs(2), g.lost())
        .await
        .expect("lost fires");
    assert_eq!(reason, LostReason::Released);
    // The next holder's fence is still larger (the µs clock floor).
    let g2 = l
        .lock("Delete/Me")
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    assert!(g2.fence() > g.fence());
    g2.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_annotations_are_reported_and_recovered() {
    let s = shared_apiserver();
    let url = format!("{}&prefix=c-", s.store_url("faults"));
    let l = leasehold_testkit::connect_as(&url, "pod-a").await;
    let g = l.lock("bad").unwrap().try_acquire().await.unwrap().unwrap();
    let fence = g.fence();
    g.release().await.unwrap();
    let patch = json!({"metadata": {"annotations": {"leasehold.io/expires": "soon", "leasehold.io/token": "x"}}});
    let (c, _) = http_request(
        s.port,
        "PATCH",
        &lease_path("faults", "c-bad"),
        &[("Content-Type", "application/merge-patch+json")],
        &patch.to_string(),
    )
    .unwrap();
    assert_eq!(c, 200);
    let seen = l
        .store()
        .inspect(&leasehold::Key::new("bad").unwrap())
        .await
        .unwrap();
    assert!(matches!(seen, Some(Inspection::Corrupt { .. })), "{seen:?}");
    let listed = l.store().list("").await.unwrap();
    assert!(listed
        .iter()
        .any(|i| matches!(i, Inspection::Corrupt { name, .. } if name == "c-bad")));
    // An acquisition recovers it, with a fence above the salvaged one.
    let g = l.lock("bad").unwrap().try_acquire().await.unwrap().unwrap();
    assert!(g.fence() > fence);
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verb_rbac_does_not_grant_is_named_in_the_error() {
    let s = ApiServer::start_with(&["--deny", "update"]);
    let l = leasehold_testkit::connect_as(&s.store_url("rbac"), "pod-a").await;
    let g = l.lock("k").unwrap().try_acquire().await.unwrap().unwrap();
    let e = g.release().await.unwrap_err();
    let msg = e.to_string();
    assert!(!e.is_retryable(), "{msg}");
    for want in [
        "forbidden",
        "verbs [\"update\"]",
        "coordination.k8s.io",
        "leases",
        "namespace rbac",
        "deploy/kubernetes/rbac.yaml",
    ] {
        assert!(msg.contains(want), "{want:?} not in {msg}");
    }
}

#[tokio::test]
async fn unreachable_and_wrong_servers_are_typed_errors() {
    let port = free_port();
    let l = leasehold::connect(&format!(
        "k8s://ns?server=http://127.0.0.1:{port}&timeout=2s"
    ))
    .await
    .unwrap();
    let e = l.lock("k").unwrap().try_acquire().await.unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    assert!(e.is_retryable());
    // Something that is not a Kubernetes API server (etcd's HTTP port) answers garbage.
    let s = shared_apiserver();
    let l = leasehold::connect(&format!("k8s://ns?server={}&timeout=2s", s.etcd().url()))
        .await
        .unwrap();
    let e = l.lock("k").unwrap().try_acquire().await.unwrap_err();
    assert!(!matches!(e, Error::InvalidKey { .. }), "{e:?}");
    for bad in [
        "k8s://NS?server=http://x",
        "k8s://ns?server=http://x&what=1",
        "kubernetes://ns?prefix=-x&server=http://x",
    ] {
        assert!(
            matches!(leasehold::connect(bad).await, Err(Error::InvalidUrl { .. })),
            "{bad}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_go_leader_lease_is_respected_until_it_expires() {
    let s = shared_apiserver();
    let now = humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string();
    let leader = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "ctrl-leader"},
        "spec": {"holderIdentity": "controller-0", "leaseDurationSeconds": 1, "renewTime": now, "acquireTime": now, "leaseTransitions": 4}});
    let (c, _) = http_request(
        s.port,
        "POST",
        "/apis/coordination.k8s.io/v1/namespaces/leader/leases",
        &[("Content-Type", "application/json")],
        &leader.to_string(),
    )
    .unwrap();
    assert_eq!(c, 201);
    let l =
        leasehold_testkit::connect_as(&format!("{}&prefix=ctrl-", s.store_url("leader")), "pod-a")
            .await;
    assert!(l
        .lock("leader")
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    let g = l
        .lock("leader")
        .unwrap()
        .wait(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    let (_, lease) = get_lease(s, "leader", "ctrl-leader");
    assert_eq!(lease["spec"]["holderIdentity"], "pod-a");
    assert_eq!(
        lease["spec"]["leaseTransitions"], 5,
        "a change of holder counts"
    );
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_keys_get_valid_distinct_names() {
    let s = shared_apiserver();
    let l =
        leasehold_testkit::connect_as(&format!("{}&prefix=task-llm-", s.store_url("hostile")), "p")
            .await;
    let long = "K".repeat(1000);
    let keys = ["../x", "..", "a/b", "A/B", "a-b", "é", " ", "-", &long];
    let mut guards = vec![];
    for k in keys {
        let g = l
            .lock(k)
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{k}"));
        guards.push(g);
    }
    let (_, list) = {
        let (c, b) = http_request(
            s.port,
            "GET",
            "/apis/coordination.k8s.io/v1/namespaces/hostile/leases",
            &[],
            "",
        )
        .unwrap();
        (c, serde_json::from_str::<Value>(&b).unwrap())
    };
    let names: std::collections::BTreeSet<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names.len(), keys.len(), "{names:?}");
    assert!(names
        .iter()
        .all(|n| n.len() <= 63 && n.starts_with("task-llm-")));
    for bad in ["", "a\0b"] {
        assert!(matches!(l.lock(bad), Err(Error::InvalidKey { .. })));
    }
    assert!(matches!(
        l.lock("x".repeat(10 * 1024)),
        Err(Error::InvalidKey { .. })
    ));
}
