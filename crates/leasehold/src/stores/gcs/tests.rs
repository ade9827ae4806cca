use super::object::{adopt, encode, parse, FOREIGN_TOKEN, FOREIGN_WAITER};

/// The foreign TTL of these tests.
const FOREIGN_TTL_MS: u64 = 60_000;

fn decode(map: &Map<String, Value>, key: &str) -> Result<LeaseRecord, object::Damaged> {
    object::decode(map, key, FOREIGN_TTL_MS)
}
use super::*;

fn map(json: &str) -> Map<String, Value> {
    parse(json.as_bytes()).unwrap()
}

fn held(key: &str) -> LeaseRecord {
    let mut r = LeaseRecord::free(key, 7);
    r.holder = Some("web-1".into());
    r.token = Some("t1".into());
    r.acquired_ms = 1_790_000_000_123;
    r.renewed_ms = r.acquired_ms;
    r.expires_ms = r.acquired_ms + 30_000;
    r.ttl_ms = 30_000;
    r.labels.insert("task".into(), "42".into());
    r
}

#[test]
fn a_record_round_trips_through_the_lock_services_json() {
    let r = held("job");
    let m = encode(&r, None, 0);
    assert_eq!(m["ownerId"], "web-1");
    assert_eq!(m["expiresAt"].as_f64(), Some(1_790_000_030.123));
    assert_eq!(m["waitingOwnerId"], Value::Null);
    assert_eq!(decode(&m, "job").unwrap(), r);
    let mut w = r.clone();
    w.waiter = Some("web-2".into());
    w.waiter_token = Some("t2".into());
    w.waiter_expires_ms = Some(r.acquired_ms + 5_000);
    w.waiter_ttl_ms = Some(5_000);
    let m = encode(&w, None, 0);
    assert_eq!(m["waitingOwnerId"], "web-2");
    assert_eq!(decode(&m, "job").unwrap(), w);
    let free = LeaseRecord::free("job", 9);
    let m = encode(&free, None, 0);
    assert_eq!(
        (&m["ownerId"], m["expiresAt"].as_f64()),
        (&Value::Null, Some(0.0))
    );
    assert_eq!(decode(&m, "job").unwrap(), free);
}

#[test]
fn an_object_of_the_lock_service_is_held_by_its_owner_until_its_expiry() {
    let m = map(
        r#"{"ownerId":"agent-7","expiresAt":1790000030.5,"waitingOwnerId":null,"waiterExpiresAt":0}"#,
    );
    let r = decode(&m, "agent-lock").unwrap();
    assert_eq!(r.key, "agent-lock");
    assert_eq!(r.holder.as_deref(), Some("agent-7"));
    assert_eq!(r.token.as_deref(), Some("gcs-owner:agent-7"));
    assert_eq!(
        (r.expires_ms, r.ttl_ms),
        (1_790_000_030_500, FOREIGN_TTL_MS)
    );
    assert!(r.is_held(1_790_000_030_499) && !r.is_held(1_790_000_030_500));
    assert!(r.waiter.is_none());
    // Without an expiry: held until someone frees it, never free.
    let r = decode(&map(r#"{"ownerId":"agent-7"}"#), "k").unwrap();
    assert!(r.is_held(u64::MAX - 1));
    // The service's waiter is a waiter.
    let m = map(
        r#"{"ownerId":"a","expiresAt":1790000030,"waitingOwnerId":"b","waiterExpiresAt":1790000040}"#,
    );
    let r = decode(&m, "k").unwrap();
    assert_eq!(r.waiter_token.as_deref(), Some("gcs-waiter:b"));
    assert_eq!(r.waiter_expires_ms, Some(1_790_000_040_000));
}

#[test]
fn our_field_describes_only_the_lease_it_was_written_with() {
    let r = held("job");
    let mut m = encode(&r, None, 0);
    // The lock service takes the lease over, keeping the fields it does not know.
    m.insert("ownerId".into(), "agent-7".into());
    m.insert("expiresAt".into(), serde_json::json!(1_790_000_100.0));
    let seen = decode(&m, "job").unwrap();
    assert_eq!(seen.token.as_deref(), Some("gcs-owner:agent-7"));
    assert_eq!(seen.fence, 7, "the fence floor stays");
    assert!(seen.labels.is_empty());
    // It releases by clearing ownerId: free, fence kept.
    m.insert("ownerId".into(), Value::Null);
    let seen = decode(&m, "job").unwrap();
    assert!(seen.token.is_none() && seen.holder.is_none());
    assert_eq!(seen.fence, 7);
}

#[test]
fn a_waiter_registration_on_a_foreign_lease_keeps_its_fields_as_read() {
    let text = r#"{"ownerId":"agent-7","expiresAt":1790000030.1234567,"color":"blue"}"#;
    let base = map(text);
    let mut r = decode(&base, "k").unwrap();
    r.waiter = Some("web-2".into());
    r.waiter_token = Some("t2".into());
    r.waiter_expires_ms = Some(1_790_000_035_000);
    r.waiter_ttl_ms = Some(5_000);
    let m = encode(&r, Some(base.clone()), 0);
    assert_eq!(m["ownerId"], base["ownerId"]);
    assert_eq!(m["expiresAt"], base["expiresAt"], "not rounded");
    assert_eq!(m["color"], "blue");
    assert_eq!(m["waitingOwnerId"], "web-2");
    assert!(m["leasehold"]["token"].is_null(), "{m:?}");
    let back = decode(&m, "k").unwrap();
    assert_eq!(back.waiter_token.as_deref(), Some("t2"));
    assert!(back
        .token
        .as_deref()
        .is_some_and(|t| t.starts_with(FOREIGN_TOKEN)));
    // A foreign waiter on our lease keeps its fields too.
    let mut ours = held("k");
    ours.waiter = Some("agent-9".into());
    ours.waiter_token = Some(format!("{FOREIGN_WAITER}agent-9"));
    ours.waiter_expires_ms = Some(1_790_000_040_000);
    let base = map(r#"{"waitingOwnerId":"agent-9","waiterExpiresAt":1790000040.0004}"#);
    let m = encode(&ours, Some(base.clone()), 0);
    assert_eq!(m["waiterExpiresAt"], base["waiterExpiresAt"]);
    assert!(m["leasehold"]["waiter_token"].is_null());
}

#[test]
fn damaged_objects_are_corrupt_unless_the_services_fields_name_a_holder() {
    for bad in [
        "not json",
        "[1]",
        r#"{"ownerId":5}"#,
        r#"{"leasehold":{"fence":"x"}}"#,
        r#"{"waitingOwnerId":"b","waiterExpiresAt":"soon"}"#,
    ] {
        assert!(
            parse(bad.as_bytes()).and_then(|m| decode(&m, "k")).is_err(),
            "{bad}"
        );
    }
    let d = decode(&map(r#"{"leasehold":{"fence":12,"key":3}}"#), "k").unwrap_err();
    assert_eq!(d.fence, Some(12));
    let r = decode(
        &map(r#"{"ownerId":"a","expiresAt":1790000030,"leasehold":{"fence":12}}"#),
        "k",
    )
    .unwrap();
    assert_eq!((r.holder.as_deref(), r.fence), (Some("a"), 12));
}

async fn store(prefix: &str) -> GcsStore {
    let mut o = GcsOptions::new("bucket");
    o.prefix = prefix.into();
    o.endpoint = Some("http://127.0.0.1:9".into());
    GcsStore::connect(o).await.unwrap()
}

#[tokio::test]
async fn object_names_are_the_keys_unless_gcs_cannot_take_them() {
    let s = store("/locks/").await;
    let k = |s: &str| Key::new(s).unwrap();
    assert_eq!(s.object_name(&k("a/b:c")), "locks/a/b:c");
    let long = "é".repeat(Key::MAX_LEN / 2);
    let n = s.object_name(&k(&long));
    assert!(n.len() <= MAX_NAME && n.starts_with("locks/éé"), "{n}");
    let dots = s.object_name(&k(".."));
    assert!(dots.starts_with("locks/--") && dots.len() == 6 + 2 + HASH_HEX);
    assert_ne!(
        s.object_name(&k(&dots[6..])),
        dots,
        "a key that looks shortened"
    );
    assert_eq!(store("").await.object_name(&k("x")), "x");
}

#[tokio::test]
async fn options_are_checked() {
    let mut o = GcsOptions::new("B");
    o.endpoint = Some("http://127.0.0.1:9".into());
    assert!(matches!(
        GcsStore::connect(o).await,
        Err(Error::InvalidOption { name: "bucket", .. })
    ));
    let mut o = GcsOptions::new("bucket");
    o.endpoint = Some("ftp://x".into());
    assert!(matches!(
        GcsStore::connect(o).await,
        Err(Error::InvalidOption {
            name: "endpoint",
            ..
        })
    ));
    let url = url::Url::parse("gs://bucket/p?endpoint=http://127.0.0.1:9&nope=1").unwrap();
    let e = from_url(&url).await.unwrap_err().to_string();
    assert!(e.contains("unknown parameter \"nope\""), "{e}");
    let url = url::Url::parse("gs://bucket/p?endpoint=http://127.0.0.1:9&timeout=3s").unwrap();
    let s = from_url(&url).await.unwrap();
    assert_eq!(s.describe(), "gs://bucket/p/?endpoint=http://127.0.0.1:9");
    let o = GcsOptions::from_url("gs://bucket/p?foreign_ttl=3s&max_clock_skew=30s").unwrap();
    assert_eq!(
        (o.foreign_ttl, o.max_clock_skew),
        (Duration::from_secs(3), Duration::from_secs(30))
    );
    let o = GcsOptions::from_url("gs://bucket/p").unwrap();
    assert_eq!(o.foreign_ttl, DEFAULT_FOREIGN_TTL);
    let url = url::Url::parse("gs://bucket/p?endpoint=http://127.0.0.1:9&foreign_ttl=0s").unwrap();
    let e = from_url(&url).await.unwrap_err().to_string();
    assert!(e.contains("foreign_ttl"), "{e}");
}

#[tokio::test]
async fn a_record_larger_than_the_read_limit_is_refused_before_writing() {
    let s = store("p").await;
    let mut r = held("k");
    r.labels.insert(
        "big".into(),
        "x".repeat(crate::stores::object::MAX_RECORD_BYTES),
    );
    let e = s.create(&Key::new("k").unwrap(), &r).await.unwrap_err();
    assert!(
        matches!(&e, Error::InvalidOption { name: "labels", .. }),
        "{e}"
    );
    assert!(e.to_string().contains("1048576"), "{e}");
    assert_eq!(s.requests(), 0, "nothing sent");
}

#[test]
fn a_foreign_expiry_is_written_back_digit_for_digit() {
    // 17 significant digits, which a best-effort float parser reads one unit off.
    let text = r#"{"ownerId":"agent-7","expiresAt":1795680243.7358553,"waitingOwnerId":null,"waiterExpiresAt":0}"#;
    let base = map(text);
    let mut r = decode(&base, "k").unwrap();
    r.waiter = Some("web-2".into());
    r.waiter_token = Some("t2".into());
    r.waiter_expires_ms = Some(1_795_680_245_000);
    r.waiter_ttl_ms = Some(3_000);
    let written = serde_json::to_string(&encode(&r, Some(base), 0)).unwrap();
    assert!(
        written.contains(r#""expiresAt":1795680243.7358553"#),
        "{written}"
    );
}

#[test]
fn expires_at_is_written_with_the_skew_margin_and_still_describes_our_lease() {
    let r = held("job");
    let m = encode(&r, None, 300_000);
    assert_eq!(m["expiresAt"].as_f64(), Some(1_790_000_330.123));
    assert_eq!(m["leasehold"]["expires_at_margin_ms"], 300_000);
    assert_eq!(
        decode(&m, "job").unwrap(),
        r,
        "the margin is ours, not a new lease"
    );
    // The same holder at another expiry is not our lease.
    let mut other = m.clone();
    other.insert("expiresAt".into(), serde_json::json!(1_790_000_030.123));
    let seen = decode(&other, "job").unwrap();
    assert_eq!(seen.token.as_deref(), Some("gcs-owner:web-1"));
    // A free object carries no margin.
    let free = encode(&LeaseRecord::free("job", 9), None, 300_000);
    assert_eq!(free["expiresAt"].as_f64(), Some(0.0));
    assert!(free["leasehold"].get("expires_at_margin_ms").is_none());
}

#[test]
fn the_other_services_leases_and_waiters_last_the_foreign_ttl() {
    let m = map(
        r#"{"ownerId":"agent-7","expiresAt":1790000030.5,"waitingOwnerId":"agent-9","waiterExpiresAt":1790000090}"#,
    );
    let r = object::decode(&m, "k", 2_000).unwrap();
    assert_eq!((r.ttl_ms, r.waiter_ttl_ms), (2_000, Some(2_000)));
}

#[test]
fn a_rewrite_of_our_lease_with_the_four_fields_only_is_still_our_lease() {
    let r = held("job");
    let ours = encode(&r, None, 300_000);
    // The other service registers as waiter: its four fields, holder's as read, ours dropped.
    let mut rewritten = map(&format!(
        r#"{{"ownerId":"web-1","expiresAt":{},"waitingOwnerId":"agent-9","waiterExpiresAt":1790000090.25}}"#,
        ours["expiresAt"]
    ));
    assert_eq!(
        decode(&rewritten, "job").unwrap().token.as_deref(),
        Some("gcs-owner:web-1"),
        "without what we wrote before, it is somebody's lease"
    );
    adopt(&mut rewritten, &ours);
    let seen = decode(&rewritten, "job").unwrap();
    assert_eq!(seen.token.as_deref(), Some("t1"), "still ours");
    assert_eq!((seen.fence, seen.labels.len()), (7, 1));
    assert_eq!(seen.waiter_token.as_deref(), Some("gcs-waiter:agent-9"));
    assert_eq!(seen.waiter_expires_ms, Some(1_790_000_090_250));
    // Renewed, the object keeps its waiter fields as read and our field again.
    let again = encode(&seen, Some(rewritten.clone()), 300_000);
    assert_eq!(again["waiterExpiresAt"], rewritten["waiterExpiresAt"]);
    assert_eq!(again["leasehold"]["token"], "t1");
    // Another owner, or our holder at another expiry, is not adopted.
    for (owner, expires) in [
        ("agent-7", ours["expiresAt"].clone()),
        ("web-1", serde_json::json!(1_790_000_400.0)),
    ] {
        let mut m = map(&format!(r#"{{"ownerId":"{owner}","expiresAt":{expires}}}"#));
        adopt(&mut m, &ours);
        let seen = decode(&m, "job").unwrap();
        assert!(
            seen.token
                .as_deref()
                .is_some_and(|t| t.starts_with(FOREIGN_TOKEN)),
            "{owner} {expires}: {seen:?}"
        );
        assert_eq!(seen.fence, 7, "the fence floor stays");
    }
    // An object that carries a field of ours is read as it is.
    let mut m = encode(&LeaseRecord::free("job", 3), None, 0);
    adopt(&mut m, &ours);
    assert_eq!(m["leasehold"]["fence"], 3);
}

/// The store a `gs://` URL names, connected.
async fn from_url(url: &url::Url) -> Result<GcsStore> {
    GcsStore::connect(GcsOptions::from_url(url.as_str())?).await
}
