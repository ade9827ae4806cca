#![allow(clippy::unwrap_used)]
use super::*;

fn store() -> KubernetesStore {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(KubernetesStore::connect(KubernetesOptions {
        namespace: Some("ns".into()),
        prefix: "task-llm-".into(),
        server: Some("http://127.0.0.1:1".into()),
        ..KubernetesOptions::default()
    }))
    .unwrap()
}

/// A lease of `Task/7` leasehold's pod-1 holds, with a waiter.
fn held() -> LeaseRecord {
    let mut r = LeaseRecord::free("Task/7", 41);
    r.holder = Some("pod-1".into());
    r.token = Some("tok".into());
    r.fence = 42;
    r.acquired_ms = 1_790_000_000_123;
    r.renewed_ms = 1_790_000_001_456;
    r.ttl_ms = 1500;
    r.expires_ms = r.renewed_ms + 1500;
    r.waiter = Some("pod-2".into());
    r.waiter_token = Some("wt".into());
    r.waiter_expires_ms = Some(r.renewed_ms + 900);
    r.waiter_ttl_ms = Some(900);
    r.pid = Some(7);
    r.host = Some("h".into());
    r.labels.insert("task".into(), "7".into());
    r
}

fn key() -> Key {
    Key::new("Task/7").unwrap()
}

fn micro(ms: i64) -> Option<MicroTime> {
    DateTime::<Utc>::from_timestamp_millis(ms).map(MicroTime)
}

/// `lease` as the API server keeps it (version `rv`), remembered as read by `store`.
fn read(store: &KubernetesStore, mut lease: Lease, rv: &str) -> Lease {
    lease.metadata.resource_version = Some(rv.into());
    store.remember(lease.metadata.name.as_deref().unwrap(), &lease);
    lease
}

/// What another client's leader election writes when it takes or renews `lease`: its own
/// spec, every annotation left as it was.
fn foreign_write(lease: &Lease, holder: &str, renewed_ms: i64, seconds: i32) -> Lease {
    let mut l = lease.clone();
    let spec = l.spec.get_or_insert_with(LeaseSpec::default);
    if spec.holder_identity.as_deref() != Some(holder) {
        spec.acquire_time = micro(renewed_ms);
    }
    spec.holder_identity = Some(holder.into());
    spec.renew_time = micro(renewed_ms);
    spec.lease_duration_seconds = Some(seconds);
    l
}

#[test]
fn records_round_trip_through_leases() {
    let store = store();
    let r = held();
    let name = store.lease_name(&key());
    let lease = store.to_lease(&name, &key(), &r, None);
    let spec = lease.spec.as_ref().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("pod-1"));
    assert_eq!(spec.lease_duration_seconds, Some(2));
    assert_eq!(
        lease.metadata.labels.as_ref().unwrap()["app.kubernetes.io/managed-by"],
        "leasehold"
    );
    let a = lease.metadata.annotations.as_ref().unwrap();
    assert_eq!(a["leasehold.io/holder"], "pod-1");
    assert_eq!(a["leasehold.io/renewed"], "2026-09-21T14:13:21.456Z");
    let back = from_lease(&lease).unwrap();
    assert_eq!(back, r);
    // Freed: no holder in the spec, fence kept.
    let freed = freed(&r, r.renewed_ms + 10);
    let back = from_lease(&store.to_lease(&name, &key(), &freed, None)).unwrap();
    assert_eq!(back.fence, 42);
    assert!(back.holder.is_none() && back.token.is_none());
    // A damaged annotation on a free Lease makes a corrupt record, with the fence salvaged.
    let mut bad = store.to_lease(&name, &key(), &freed, None);
    let a = bad.metadata.annotations.as_mut().unwrap();
    a.insert("leasehold.io/token".into(), "x".into());
    a.insert("leasehold.io/expires".into(), "soon".into());
    bad.metadata.resource_version = Some("9".into());
    assert!(matches!(
        stored(&bad),
        Stored::Corrupt {
            salvaged_fence: Some(42),
            ..
        }
    ));
}

#[test]
fn damaged_annotations_never_free_a_lease_the_spec_says_is_held() {
    let store = store();
    let r = held();
    let mut bad = store.to_lease(&store.lease_name(&key()), &key(), &r, None);
    bad.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("leasehold.io/expires".into(), "soon".into());
    let back = from_lease(&bad).unwrap();
    assert_eq!(back.holder.as_deref(), Some("pod-1"));
    assert_eq!(back.token.as_deref(), Some("k8s-holder:pod-1"));
    assert_eq!(
        back.expires_ms,
        r.renewed_ms + 2000,
        "renewTime + leaseDurationSeconds"
    );
    assert_eq!(back.fence, 42);
}

#[test]
fn foreign_leases_are_held_by_their_holder_identity() {
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("leader".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("controller-0".into()),
            lease_duration_seconds: Some(15),
            renew_time: micro(1_000_000),
            ..LeaseSpec::default()
        }),
    };
    let r = from_lease(&lease).unwrap();
    assert_eq!(r.holder.as_deref(), Some("controller-0"));
    assert_eq!(r.expires_ms, 1_015_000);
    assert_eq!(r.token.as_deref(), Some("k8s-holder:controller-0"));
}

#[test]
fn another_client_taking_a_lease_leasehold_held_or_used_is_its_holder() {
    let store = store();
    let r = held();
    let name = store.lease_name(&key());
    let t = r.expires_ms as i64 + 5_000;
    // Taken after pod-1's lease expired: leasehold's annotations (pod-1's token) stay.
    let taken = foreign_write(&store.to_lease(&name, &key(), &r, None), "py-a", t, 3);
    let back = from_lease(&taken).unwrap();
    assert_eq!(back.holder.as_deref(), Some("py-a"));
    assert_eq!(back.token.as_deref(), Some("k8s-holder:py-a"));
    assert_eq!(back.expires_ms, t as u64 + 3000);
    assert_eq!((back.key.as_str(), back.fence), ("Task/7", 42));
    // Released by leasehold first (annotations without a token), then taken.
    let freed = freed(&r, r.renewed_ms + 10);
    let taken = foreign_write(&store.to_lease(&name, &key(), &freed, None), "py-a", t, 3);
    let back = from_lease(&taken).unwrap();
    assert_eq!(back.holder.as_deref(), Some("py-a"));
    assert_eq!(back.expires_ms, t as u64 + 3000);
    // Renewed by pod-1's own holderIdentity from another client (the same name): still the
    // spec's renewTime counts.
    let renewed = foreign_write(&store.to_lease(&name, &key(), &r, None), "pod-1", t, 3);
    assert_eq!(from_lease(&renewed).unwrap().expires_ms, t as u64 + 3000);
}

#[test]
fn a_waiter_registered_on_another_clients_lease_leaves_its_spec_alone() {
    let store = store();
    let name = store.lease_name(&key());
    let mut theirs = foreign_write(
        &Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(BTreeMap::from([("app".to_owned(), "agent".to_owned())])),
                annotations: Some(BTreeMap::from([("team".to_owned(), "x".to_owned())])),
                ..ObjectMeta::default()
            },
            spec: None,
        },
        "py-a",
        1_790_000_000_000,
        3,
    );
    theirs.spec.as_mut().unwrap().renew_time = Some(MicroTime(
        DateTime::<Utc>::from_timestamp_micros(1_790_000_000_000_123).unwrap(),
    ));
    let theirs = read(&store, theirs, "5");
    let r = from_lease(&theirs).unwrap();
    let mut w = r.clone();
    w.waiter = Some("pod-2".into());
    w.waiter_token = Some("wt".into());
    w.waiter_expires_ms = Some(1_790_000_009_000);
    let written = store.to_lease(&name, &key(), &w, Some("5"));
    assert_eq!(
        written.spec, theirs.spec,
        "the holder's spec, to the microsecond"
    );
    let a = written.metadata.annotations.as_ref().unwrap();
    assert_eq!(a["team"], "x");
    assert_eq!(a["leasehold.io/waiter-token"], "wt");
    for own in ["token", "expires", "holder", "renewed", "ttl-ms"] {
        assert!(
            !a.contains_key(&format!("leasehold.io/{own}")),
            "{own}: {a:?}"
        );
    }
    assert_eq!(written.metadata.labels.as_ref().unwrap()["app"], "agent");
    // The holder renews: the record follows its renewTime, the waiter stays.
    let renewed = foreign_write(&written, "py-a", 1_790_000_002_000, 3);
    let back = from_lease(&renewed).unwrap();
    assert_eq!(back.expires_ms, 1_790_000_005_000);
    assert_eq!(back.waiter_token.as_deref(), Some("wt"));
    // A waiter write that an older leasehold made (the holder's token copied, an expiry
    // frozen at the time) does not hide a later renewal either.
    let mut old = renewed.clone();
    let a = old.metadata.annotations.as_mut().unwrap();
    a.insert("leasehold.io/token".into(), "k8s-holder:py-a".into());
    a.insert("leasehold.io/expires".into(), fmt_ms(1_790_000_003_000));
    a.insert("leasehold.io/ttl-ms".into(), "3000".into());
    assert_eq!(from_lease(&old).unwrap().expires_ms, 1_790_000_005_000);
}

#[test]
fn leases_an_older_leasehold_wrote_are_read_by_their_times() {
    let store = store();
    let r = held();
    let mut lease = store.to_lease(&store.lease_name(&key()), &key(), &r, None);
    let a = lease.metadata.annotations.as_mut().unwrap();
    a.remove("leasehold.io/holder");
    a.remove("leasehold.io/renewed");
    // expires = renewTime + ttl-ms: leasehold's own lease.
    assert_eq!(from_lease(&lease).unwrap(), r);
    // Renewed by another client since: the spec's.
    let renewed = foreign_write(&lease, "pod-1", r.renewed_ms as i64 + 1000, 3);
    let back = from_lease(&renewed).unwrap();
    assert_eq!(back.token.as_deref(), Some("k8s-holder:pod-1"));
    assert_eq!(back.expires_ms, r.renewed_ms + 4000);
}

#[test]
fn a_change_of_holder_counts_and_foreign_metadata_is_kept() {
    let store = store();
    let name = store.lease_name(&key());
    let mut lease = foreign_write(
        &Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                annotations: Some(BTreeMap::from([("team".to_owned(), "x".to_owned())])),
                ..ObjectMeta::default()
            },
            spec: None,
        },
        "py-a",
        1_000_000,
        3,
    );
    lease.spec.as_mut().unwrap().lease_transitions = Some(4);
    lease.spec.as_mut().unwrap().preferred_holder = Some("py-b".into());
    let lease = read(&store, lease, "7");
    let mut g = from_lease(&lease).unwrap();
    g.holder = Some("pod-1".into());
    g.token = Some("tok".into());
    g.renewed_ms = 1_005_000;
    g.expires_ms = 1_006_000;
    g.ttl_ms = 1000;
    let written = store.to_lease(&name, &key(), &g, Some("7"));
    let spec = written.spec.as_ref().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("pod-1"));
    assert_eq!(spec.lease_transitions, Some(5));
    assert_eq!(spec.preferred_holder.as_deref(), Some("py-b"));
    assert_eq!(written.metadata.annotations.as_ref().unwrap()["team"], "x");
    assert_eq!(from_lease(&written).unwrap().token.as_deref(), Some("tok"));
}

#[test]
fn bad_urls_are_typed_errors() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for url in [
        "k8s://Bad_NS?server=http://127.0.0.1:1",
        "k8s://ns?server=ftp://x",
        "k8s://ns?server=http://127.0.0.1:1&prefix=UP",
        "k8s://ns?server=http://127.0.0.1:1&nope=1",
        "k8s://ns/path?server=http://127.0.0.1:1",
        "k8s://ns?server=http://127.0.0.1:1&timeout=0s",
    ] {
        let u = url::Url::parse(url).unwrap();
        let r = rt.block_on(from_url(&u));
        assert!(matches!(r, Err(Error::InvalidUrl { .. })), "{url}: {r:?}");
    }
    // No namespace in the URL: the configuration's (`default` for a bare server).
    let u = url::Url::parse("k8s://?server=http://127.0.0.1:1&prefix=task-llm-").unwrap();
    let s = rt.block_on(from_url(&u)).unwrap();
    if std::env::var_os("POD_NAMESPACE").is_none() {
        assert_eq!(s.namespace(), "default");
    }
    assert!(s
        .lease_name(&Key::new("x").unwrap())
        .starts_with("task-llm-"));
}

/// The store a `k8s://` URL names, connected.
async fn from_url(url: &url::Url) -> Result<KubernetesStore> {
    KubernetesStore::connect(KubernetesOptions::from_url(url.as_str())?).await
}

/// `r` freed at `now_ms` ([`crate::decide::Rules::freed`], times on this clock).
fn freed(r: &LeaseRecord, now_ms: u64) -> LeaseRecord {
    crate::decide::Rules::clock(crate::decide::Now::at_ms(now_ms)).freed(r)
}
