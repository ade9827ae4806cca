//! leasehold-apiserver held to the Kubernetes API conventions (status codes, `Status` objects,
//! resourceVersion semantics, selectors, watch), over a real etcd started by the test kit.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold_testkit::servers::{http_request, shared_apiserver, ApiServer};
use serde_json::{json, Value};
use std::process::Command;

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces";

fn ns(name: &str) -> String {
    format!("t{:06x}-{name}", fastrand_u32() & 0xff_ffff)
}

fn fastrand_u32() -> u32 {
    use std::time::{SystemTime, UNIX_EPOCH};
    let n = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    n ^ std::process::id().rotate_left(16)
}

fn call(s: &ApiServer, method: &str, path: &str, ct: &str, body: &Value) -> (u16, Value) {
    let text = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let (code, out) = http_request(s.port, method, path, &[("Content-Type", ct)], &text)
        .unwrap_or_else(|| panic!("no answer to {method} {path}"));
    let v = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{method} {path}: {e}: {out}"));
    (code, v)
}

fn req(s: &ApiServer, method: &str, path: &str, body: &Value) -> (u16, Value) {
    call(s, method, path, "application/json", body)
}

fn lease(name: &str, holder: &str) -> Value {
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "labels": {"app": "t"}},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 10}})
}

fn rv(v: &Value) -> String {
    v["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion")
        .to_owned()
}

fn assert_status(v: &Value, code: u16, reason: &str) {
    assert_eq!(v["kind"], "Status", "{v}");
    assert_eq!(v["apiVersion"], "v1", "{v}");
    assert_eq!(v["status"], "Failure", "{v}");
    assert_eq!(v["code"], code, "{v}");
    assert_eq!(v["reason"], reason, "{v}");
}

#[test]
fn discovery_documents() {
    let s = shared_apiserver();
    let (c, v) = req(s, "GET", "/api", &Value::Null);
    assert_eq!((c, v["kind"].as_str()), (200, Some("APIVersions")));
    let (c, v) = req(s, "GET", "/apis", &Value::Null);
    assert_eq!(c, 200);
    assert_eq!(v["kind"], "APIGroupList");
    assert_eq!(v["groups"][0]["name"], "coordination.k8s.io");
    assert_eq!(
        v["groups"][0]["preferredVersion"]["groupVersion"],
        "coordination.k8s.io/v1"
    );
    let (c, v) = req(s, "GET", "/apis/coordination.k8s.io/v1", &Value::Null);
    assert_eq!(c, 200);
    assert_eq!(v["kind"], "APIResourceList");
    let r = &v["resources"][0];
    assert_eq!(
        (r["name"].as_str(), r["kind"].as_str()),
        (Some("leases"), Some("Lease"))
    );
    assert_eq!(r["namespaced"], true);
    for verb in [
        "create", "delete", "get", "list", "patch", "update", "watch",
    ] {
        assert!(r["verbs"].as_array().unwrap().contains(&json!(verb)), "{r}");
    }
    let (c, v) = req(s, "GET", "/version", &Value::Null);
    assert_eq!((c, v["major"].as_str()), (200, Some("1")));
    let (c, v) = req(s, "GET", "/no/such/path", &Value::Null);
    assert_eq!(c, 404);
    assert_status(&v, 404, "NotFound");
}

#[test]
fn create_is_201_and_stored_in_etcd_at_its_mod_revision() {
    let s = shared_apiserver();
    let ns = ns("create");
    let path = format!("{LEASES}/{ns}/leases");
    let (c, v) = req(s, "POST", &path, &lease("a", "pod-1"));
    assert_eq!(c, 201, "{v}");
    assert_eq!(v["kind"], "Lease");
    assert_eq!(v["metadata"]["namespace"], ns.as_str());
    assert_eq!(v["metadata"]["uid"].as_str().unwrap().len(), 36, "{v}");
    assert!(v["metadata"]["creationTimestamp"]
        .as_str()
        .unwrap()
        .ends_with('Z'));
    let version = rv(&v);

    // The object is JSON under /registry/leases/<ns>/<name>, resourceVersion = mod revision.
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &s.etcd().url(), "get", "-w", "json"])
        .arg(format!("/registry/leases/{ns}/a"))
        .output()
        .expect("etcdctl (apt-get install etcd-client)");
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["kvs"][0]["mod_revision"].to_string(), version);
    let (c, g) = req(s, "GET", &format!("{path}/a"), &Value::Null);
    assert_eq!((c, rv(&g)), (200, version));
    assert_eq!(g["spec"]["holderIdentity"], "pod-1");

    let (c, v) = req(s, "POST", &path, &lease("a", "pod-2"));
    assert_eq!(c, 409);
    assert_status(&v, 409, "AlreadyExists");
    assert_eq!(v["details"]["name"], "a");
    assert_eq!(v["details"]["kind"], "leases");
}

#[test]
fn not_found_invalid_and_bad_requests() {
    let s = shared_apiserver();
    let ns = ns("errors");
    let path = format!("{LEASES}/{ns}/leases");
    let (c, v) = req(s, "GET", &format!("{path}/nope"), &Value::Null);
    assert_eq!(c, 404);
    assert_status(&v, 404, "NotFound");
    for bad in ["Upper", "-x", "a_b", "x-"] {
        let (c, v) = req(s, "POST", &path, &lease(bad, "p"));
        assert_eq!(c, 422, "{bad}: {v}");
        assert_status(&v, 422, "Invalid");
    }
    let (c, v) = req(s, "POST", &path, &lease(&"a".repeat(254), "p"));
    assert_status(&v, 422, "Invalid");
    assert_eq!(c, 422);
    let mut zero = lease("zero", "p");
    zero["spec"]["leaseDurationSeconds"] = json!(0);
    let (c, v) = req(s, "POST", &path, &zero);
    assert_eq!(c, 422, "{v}");
    let (c, v) = call(s, "POST", &path, "application/json", &json!("garbage"));
    assert_eq!(c, 400, "{v}");
    assert_status(&v, 400, "BadRequest");
    let mut other_ns = lease("o", "p");
    other_ns["metadata"]["namespace"] = json!("elsewhere");
    let (c, _) = req(s, "POST", &path, &other_ns);
    assert_eq!(c, 400);
    let (c, _) = req(
        s,
        "POST",
        &format!("{LEASES}/Bad_NS/leases"),
        &lease("x", "p"),
    );
    assert_eq!(c, 422);
}

#[test]
fn update_is_conditioned_on_resource_version() {
    let s = shared_apiserver();
    let ns = ns("update");
    let path = format!("{LEASES}/{ns}/leases");
    let (_, created) = req(s, "POST", &path, &lease("u", "pod-1"));
    let v1 = rv(&created);

    let mut next = created.clone();
    next["spec"]["holderIdentity"] = json!("pod-2");
    let (c, updated) = req(s, "PUT", &format!("{path}/u"), &next);
    assert_eq!(c, 200, "{updated}");
    let v2 = rv(&updated);
    assert!(v2.parse::<i64>().unwrap() > v1.parse::<i64>().unwrap());
    assert_eq!(updated["metadata"]["uid"], created["metadata"]["uid"]);
    assert_eq!(
        updated["metadata"]["creationTimestamp"],
        created["metadata"]["creationTimestamp"]
    );

    // Stale resourceVersion: 409 Conflict, nothing written.
    next["spec"]["holderIdentity"] = json!("pod-3");
    let (c, v) = req(s, "PUT", &format!("{path}/u"), &next);
    assert_eq!(c, 409);
    assert_status(&v, 409, "Conflict");
    assert!(v["message"]
        .as_str()
        .unwrap()
        .contains("the object has been modified"));
    let (_, g) = req(s, "GET", &format!("{path}/u"), &Value::Null);
    assert_eq!(g["spec"]["holderIdentity"], "pod-2");

    // No resourceVersion: unconditional.
    next["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    let (c, v) = req(s, "PUT", &format!("{path}/u"), &next);
    assert_eq!(
        (c, v["spec"]["holderIdentity"].as_str()),
        (200, Some("pod-3"))
    );

    // Name mismatch: 400; missing object: 404.
    let (c, _) = req(s, "PUT", &format!("{path}/other"), &next);
    assert_eq!(c, 400);
    let mut missing = lease("missing", "p");
    missing["metadata"]["resourceVersion"] = json!("5");
    let (c, v) = req(s, "PUT", &format!("{path}/missing"), &missing);
    assert_eq!(c, 404);
    assert_status(&v, 404, "NotFound");
}

#[test]
fn merge_patch() {
    let s = shared_apiserver();
    let ns = ns("patch");
    let path = format!("{LEASES}/{ns}/leases");
    let (_, created) = req(s, "POST", &path, &lease("p", "pod-1"));
    let item = format!("{path}/p");
    let patch = json!({"metadata": {"annotations": {"leasehold.io/fence": "7"}},
        "spec": {"holderIdentity": null, "leaseTransitions": 3}});
    let (c, v) = call(s, "PATCH", &item, "application/merge-patch+json", &patch);
    assert_eq!(c, 200, "{v}");
    assert!(v["spec"].get("holderIdentity").is_none(), "{v}");
    assert_eq!(v["spec"]["leaseTransitions"], 3);
    assert_eq!(v["spec"]["leaseDurationSeconds"], 10);
    assert_eq!(v["metadata"]["annotations"]["leasehold.io/fence"], "7");
    assert_eq!(v["metadata"]["labels"]["app"], "t");
    assert_eq!(v["metadata"]["uid"], created["metadata"]["uid"]);

    // resourceVersion in a merge patch is a precondition.
    let stale =
        json!({"metadata": {"resourceVersion": rv(&created)}, "spec": {"holderIdentity": "x"}});
    let (c, v) = call(s, "PATCH", &item, "application/merge-patch+json", &stale);
    assert_eq!(c, 409);
    assert_status(&v, 409, "Conflict");
    let (c, v) = call(s, "PATCH", &item, "application/json-patch+json", &json!([]));
    assert_eq!(c, 415, "{v}");
    let (c, _) = call(
        s,
        "PATCH",
        &format!("{path}/none"),
        "application/merge-patch+json",
        &patch,
    );
    assert_eq!(c, 404);
}

#[test]
fn delete_with_preconditions() {
    let s = shared_apiserver();
    let ns = ns("delete");
    let path = format!("{LEASES}/{ns}/leases");
    let (_, created) = req(s, "POST", &path, &lease("d", "pod-1"));
    let item = format!("{path}/d");
    let (_, patched) = call(
        s,
        "PATCH",
        &item,
        "application/merge-patch+json",
        &json!({"spec": {"leaseTransitions": 1}}),
    );

    let stale = json!({"kind": "DeleteOptions", "apiVersion": "v1",
        "preconditions": {"resourceVersion": rv(&created)}});
    let (c, v) = req(s, "DELETE", &item, &stale);
    assert_eq!(c, 409, "{v}");
    assert_status(&v, 409, "Conflict");
    assert!(v["message"]
        .as_str()
        .unwrap()
        .contains("Precondition failed"));

    let bad_uid = json!({"preconditions": {"uid": "00000000-0000-0000-0000-000000000000"}});
    let (c, _) = req(s, "DELETE", &item, &bad_uid);
    assert_eq!(c, 409);

    let fresh = json!({"preconditions": {"resourceVersion": rv(&patched), "uid": created["metadata"]["uid"]}});
    let (c, v) = req(s, "DELETE", &item, &fresh);
    assert_eq!(c, 200, "{v}");
    assert_eq!(v["metadata"]["name"], "d");
    let (c, _) = req(s, "GET", &item, &Value::Null);
    assert_eq!(c, 404);
    let (c, v) = req(s, "DELETE", &item, &Value::Null);
    assert_eq!(c, 404);
    assert_status(&v, 404, "NotFound");

    // Unconditional delete.
    req(s, "POST", &path, &lease("d2", "p"));
    let (c, _) = req(s, "DELETE", &format!("{path}/d2"), &Value::Null);
    assert_eq!(c, 200);
}

#[test]
fn list_with_label_and_field_selectors() {
    let s = shared_apiserver();
    let ns = ns("list");
    let path = format!("{LEASES}/{ns}/leases");
    for (name, app) in [("l1", "a"), ("l2", "b"), ("l3", "a")] {
        let mut l = lease(name, "p");
        l["metadata"]["labels"]["app"] = json!(app);
        assert_eq!(req(s, "POST", &path, &l).0, 201);
    }
    let names = |q: &str| -> Vec<String> {
        let (c, v) = req(s, "GET", &format!("{path}{q}"), &Value::Null);
        assert_eq!(c, 200, "{v}");
        assert_eq!(v["kind"], "LeaseList");
        assert!(v["metadata"]["resourceVersion"].as_str().is_some());
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names(""), ["l1", "l2", "l3"]);
    assert_eq!(names("?labelSelector=app%3Da"), ["l1", "l3"]);
    assert_eq!(names("?labelSelector=app%21%3Da"), ["l2"]);
    assert_eq!(names("?labelSelector=app+in+%28b%2Cc%29"), ["l2"]);
    assert_eq!(names("?fieldSelector=metadata.name%3Dl3"), ["l3"]);
    let (c, v) = req(
        s,
        "GET",
        "/apis/coordination.k8s.io/v1/leases?labelSelector=app%3Db",
        &Value::Null,
    );
    assert_eq!(c, 200);
    assert!(v["items"]
        .as_array()
        .unwrap()
        .iter()
        .any(|i| i["metadata"]["namespace"] == ns.as_str()));
}

#[test]
fn watch_streams_added_modified_deleted() {
    let s = shared_apiserver();
    let ns = ns("watch");
    let path = format!("{LEASES}/{ns}/leases");
    let (_, list) = req(s, "GET", &path, &Value::Null);
    let from = rv(&list);
    let (_, created) = req(s, "POST", &path, &lease("w", "pod-1"));
    let (_, other) = req(s, "POST", &path, &{
        let mut l = lease("w-other", "x");
        l["metadata"]["labels"]["app"] = json!("other");
        l
    });
    let _ = other;
    let (_, patched) = call(
        s,
        "PATCH",
        &format!("{path}/w"),
        "application/merge-patch+json",
        &json!({"spec": {"holderIdentity": "pod-2"}}),
    );
    let (c, _) = req(s, "DELETE", &format!("{path}/w"), &Value::Null);
    assert_eq!(c, 200);
    // Events after `from`, filtered by label; the stream ends after timeoutSeconds.
    let (c, body) = http_request(
        s.port,
        "GET",
        &format!("{path}?watch=1&resourceVersion={from}&labelSelector=app%3Dt&timeoutSeconds=1"),
        &[],
        "",
    )
    .unwrap();
    assert_eq!(c, 200);
    let events: Vec<Value> = body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["ADDED", "MODIFIED", "DELETED"], "{body}");
    assert_eq!(rv(&events[0]["object"]), rv(&created));
    assert_eq!(rv(&events[1]["object"]), rv(&patched));
    assert_eq!(events[1]["object"]["spec"]["holderIdentity"], "pod-2");
    assert!(
        rv(&events[2]["object"]).parse::<i64>().unwrap() > rv(&patched).parse::<i64>().unwrap()
    );

    // Without a resourceVersion, the current objects come first as ADDED.
    let (_, body) = http_request(
        s.port,
        "GET",
        &format!("{path}?watch=true&timeoutSeconds=1"),
        &[],
        "",
    )
    .unwrap();
    let events: Vec<Value> = body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 1, "{body}");
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["metadata"]["name"], "w-other");
}

#[test]
fn concurrent_creates_have_one_winner_and_request_counts() {
    let s = ApiServer::start();
    let ns = ns("race");
    let path = format!("{LEASES}/{ns}/leases");
    let codes: Vec<u16> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..16)
            .map(|i| {
                sc.spawn({
                    let path = path.clone();
                    let s = &s;
                    move || req(s, "POST", &path, &lease("race", &format!("p{i}"))).0
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(codes.iter().filter(|c| **c == 201).count(), 1, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 409).count(), 15, "{codes:?}");
    let counts = s.requests();
    assert_eq!(counts["byVerb"]["create"], 16, "{counts}");
    assert!(counts["maxInFlightPerLease"].as_u64().unwrap() >= 1);
    s.reset_requests();
    assert_eq!(s.requests()["total"], 0);
}

#[test]
fn server_side_printing_and_rbac_style_denials() {
    let s = ApiServer::start_with(&["--deny", "update"]);
    let path = format!("{LEASES}/tables/leases");
    let (_, created) = req(&s, "POST", &path, &lease("t1", "pod-9"));
    let accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
    let (c, body) = http_request(s.port, "GET", &path, &[("Accept", accept)], "").unwrap();
    assert_eq!(c, 200);
    let t: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(t["kind"], "Table", "{t}");
    let cols: Vec<&str> = t["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(cols, ["Name", "Holder", "Age"]);
    assert_eq!(t["rows"][0]["cells"][0], "t1");
    assert_eq!(t["rows"][0]["cells"][1], "pod-9");
    assert!(t["rows"][0]["cells"][2].as_str().unwrap().ends_with('s'));
    assert_eq!(
        t["rows"][0]["object"]["metadata"]["uid"],
        created["metadata"]["uid"]
    );

    let (c, v) = req(&s, "PUT", &format!("{path}/t1"), &created);
    assert_eq!(c, 403);
    assert_status(&v, 403, "Forbidden");
    assert!(v["message"].as_str().unwrap().contains("cannot update resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"tables\""), "{v}");
}
