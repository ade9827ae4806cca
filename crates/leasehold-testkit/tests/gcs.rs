//! The GCS store against `fake-gcs-server`: the server itself refuses stale conditional writes;
//! leasehold and a process of the seed lock service (its JSON written by hand, as that service
//! writes it) exclude each other; a stolen lease is lost; several OS processes count without
//! overlap.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::{Key, LostReason};
use leasehold_testkit::gcs_server::{shared_gcs, GcsServer};
use leasehold_testkit::servers::Pausable;
use serde_json::{json, Value};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const WORKER: &str = env!("CARGO_BIN_EXE_leasehold-worker");

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The object as JSON.
fn object(server: &GcsServer, name: &str) -> Value {
    let text = server
        .get_raw(name)
        .unwrap_or_else(|| panic!("no object {name}"));
    serde_json::from_str(&text).unwrap()
}

/// The current generation of `name`, by writing it again unconditionally (the emulator has no
/// other cheap way to answer it with the body).
fn rewrite(server: &GcsServer, name: &str, body: &Value) -> String {
    let (code, generation) = server.put_raw(name, &body.to_string(), None);
    assert_eq!(code, 200);
    generation
}

/// The suite can fail: the emulator refuses a create of an existing object and a replace of a
/// generation that is no longer current, on the multipart uploads the store sends.
#[test]
fn the_server_refuses_stale_conditional_writes() {
    let server = shared_gcs();
    let name = format!("{}/stale", leasehold_testkit::prefix("raw"));
    let (code, g1) = server.put_raw(&name, r#"{"n":1}"#, Some("0"));
    assert_eq!(code, 200, "create");
    let (code, _) = server.put_raw(&name, r#"{"n":2}"#, Some("0"));
    assert_eq!(code, 412, "a second create");
    let (code, g2) = server.put_raw(&name, r#"{"n":2}"#, Some(&g1));
    assert_eq!(code, 200, "a replace of the current generation");
    assert_ne!(g1, g2);
    let (code, _) = server.put_raw(&name, r#"{"n":3}"#, Some(&g1));
    assert_eq!(code, 412, "a replace of a stale generation");
    assert_eq!(object(server, &name)["n"], 2);
}

/// The test kit's proxy in front of the emulator refuses a DELETE whose `ifGenerationMatch` is
/// stale (412) or whose object is gone (404), with Cloud Storage's JSON error, and carries out one
/// on the current generation; the emulator alone carries out the stale one.
#[test]
fn the_proxy_enforces_the_delete_precondition() {
    let server = shared_gcs();
    let name = format!("{}/del", leasehold_testkit::prefix("raw"));
    let delete = |port: u16, generation: &str| {
        let path = format!(
            "/storage/v1/b/{}/o/{}?ifGenerationMatch={generation}",
            leasehold_testkit::gcs_server::BUCKET,
            name.replace('/', "%2F")
        );
        leasehold_testkit::servers::http_request(port, "DELETE", &path, &[], "").unwrap()
    };
    let (_, g1) = server.put_raw(&name, r#"{"n":1}"#, Some("0"));
    let (_, g2) = server.put_raw(&name, r#"{"n":2}"#, Some(&g1));
    let (code, body) = delete(server.proxy_port(), &g1);
    assert_eq!(code, 412, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["error"]["errors"][0]["reason"], "conditionNotMet",
        "{body}"
    );
    assert_eq!(object(server, &name)["n"], 2);
    let (code, _) = delete(server.proxy_port(), &g2);
    assert!((200..300).contains(&code), "{code}");
    assert!(server.get_raw(&name).is_none());
    let (code, body) = delete(server.proxy_port(), &g2);
    assert_eq!(code, 404, "{body}");
    // The emulator itself: the stale delete goes through.
    let (_, g1) = server.put_raw(&name, r#"{"n":1}"#, Some("0"));
    server.put_raw(&name, r#"{"n":2}"#, Some(&g1));
    let (code, _) = delete(server.port, &g1);
    assert!((200..300).contains(&code), "{code}");
    assert!(server.get_raw(&name).is_none());
}

/// A lease the seed service holds (its JSON as it writes it, without leasehold's fields): held by
/// its `ownerId` for leasehold, which registers as its waiter without touching the holder's
/// fields, and takes it once the object has gone unchanged for that service's lease length
/// (`foreign_ttl`, 2 s here), by the server's clock and its own observation, not by `expiresAt`
/// on its own clock. leasehold's own object
/// then reads, in the seed's fields, as held by leasehold until its `expiresAt` (written with the
/// skew margin).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leasehold_and_the_single_waiter_lock_service_exclude_each_other() {
    let server = shared_gcs();
    let prefix = leasehold_testkit::prefix("seed");
    let url = format!(
        "{}&max_clock_skew=500ms&foreign_ttl=2s",
        server.store_url(&prefix)
    );
    let name = format!("{prefix}/agent-lock");
    let expires = now_secs() + 1.5;
    let seed = json!({"ownerId": "agent-7", "expiresAt": expires, "waitingOwnerId": null, "waiterExpiresAt": 0});
    let (code, _) = server.put_raw(&name, &seed.to_string(), Some("0"));
    assert_eq!(code, 200);

    let l = leasehold_testkit::connect_as(&url, "web-1").await;
    let refused = l.lock("agent-lock").unwrap().try_acquire().await.unwrap();
    assert!(refused.is_none(), "held by agent-7");
    let key = Key::new("agent-lock").unwrap();
    let seen = l.store().inspect(&key).await.unwrap();
    assert!(
        matches!(&seen, Some(leasehold::Inspection::Record(r)) if r.holder.as_deref() == Some("agent-7")),
        "{seen:?}"
    );

    let waiting = {
        let l = l.clone();
        tokio::spawn(async move {
            let g = l
                .lock("agent-lock")
                .unwrap()
                .ttl(Duration::from_secs(3))
                .wait(Duration::from_secs(10))
                .acquire()
                .await
                .unwrap();
            (g, now_secs())
        })
    };
    // The waiter registration is in the seed's fields; the holder's are as the seed wrote them.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let o = object(server, &name);
        if o["waitingOwnerId"] == "web-1" {
            assert_eq!(o["ownerId"], "agent-7");
            assert_eq!(o["expiresAt"], seed["expiresAt"], "{o}");
            assert!(o["waiterExpiresAt"].as_f64().unwrap() > now_secs());
            break;
        }
        assert!(Instant::now() < deadline, "no waiter registration: {o}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (guard, got_at) = waiting.await.unwrap();
    // Written 1.5 s before its expiresAt: 2 s unchanged is 0.5 s after it.
    assert!(
        got_at >= expires + 0.5,
        "taken {:.3} s after expiresAt, before 2 s unchanged",
        got_at - expires
    );
    // For the seed service, leasehold holds it now.
    let o = object(server, &name);
    assert_eq!(o["ownerId"], "web-1", "{o}");
    // Its expiresAt: leasehold's expiry plus the assumed skew (500 ms), the margin that service,
    // judging it on its own clock, needs.
    let theirs = o["expiresAt"].as_f64().unwrap();
    assert!(
        theirs > now_secs() + 0.5 && theirs <= now_secs() + 3.6,
        "{o}"
    );
    assert!(o["leasehold"]["fence"].as_u64().unwrap() > 0, "{o}");

    // The seed service asks for it as waiter, as it does: read the object and its generation,
    // set its two waiter fields, write conditioned on that generation (again if leasehold
    // renewed in between): the holder's handoff_requested fires, and the released lease is
    // reserved for agent-9.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (mut o, generation) = read_with_generation(server, &name);
        o["waitingOwnerId"] = json!("agent-9");
        o["waiterExpiresAt"] = json!(now_secs() + 5.0);
        let (code, _) = server.put_raw(&name, &o.to_string(), Some(&generation));
        if code == 200 {
            break;
        }
        assert_eq!(code, 412);
        assert!(
            Instant::now() < deadline,
            "the seed's waiter write never went through"
        );
    }
    let who = tokio::time::timeout(Duration::from_secs(5), guard.handoff_requested())
        .await
        .expect("handoff requested");
    assert_eq!(who, "agent-9");
    guard.release().await.unwrap();
    let o = object(server, &name);
    assert_eq!(o["ownerId"], Value::Null, "{o}");
    assert_eq!(o["waitingOwnerId"], "agent-9", "{o}");
    let other = leasehold_testkit::connect_as(&url, "web-2").await;
    let reserved = other
        .lock("agent-lock")
        .unwrap()
        .try_acquire()
        .await
        .unwrap();
    assert!(reserved.is_none(), "reserved for agent-9");
}

/// The object `name` and its generation, read consistently (the generation before and after the
/// read agree).
fn read_with_generation(server: &GcsServer, name: &str) -> (Value, String) {
    loop {
        let before = current_generation(server, name).expect("the object exists");
        let o = object(server, name);
        if current_generation(server, name).as_deref() == Some(before.as_str()) {
            return (o, before);
        }
    }
}

/// The generation of `name`, from the object's metadata.
fn current_generation(server: &GcsServer, name: &str) -> Option<String> {
    let path = format!(
        "/storage/v1/b/{}/o/{}",
        leasehold_testkit::gcs_server::BUCKET,
        name.replace('%', "%25").replace('/', "%2F")
    );
    let (code, text) = leasehold_testkit::servers::http_get(server.port, &path)?;
    (code == 200).then_some(())?;
    let v: Value = serde_json::from_str(&text).ok()?;
    v["generation"].as_str().map(str::to_owned)
}

/// The seed service takes the object over (its write conditioned on the generation it read):
/// leasehold's holder loses the lease at its next renewal, naming the new owner. (A 3 s TTL: a
/// renewal late on a loaded machine must not end the lease by its own clock first.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_the_single_waiter_lock_service_overwrites_is_lost() {
    let server = shared_gcs();
    let prefix = leasehold_testkit::prefix("stolen");
    let l = leasehold_testkit::connect_as(&server.store_url(&prefix), "web-1").await;
    let guard = leasehold_testkit::take(&l, "job", Duration::from_secs(3)).await;
    let name = format!("{prefix}/job");
    let stolen = json!({"ownerId": "agent-7", "expiresAt": now_secs() + 60.0});
    let generation = current_generation(server, &name).unwrap();
    let (code, _) = server.put_raw(&name, &stolen.to_string(), Some(&generation));
    if code == 412 {
        // Renewed in between: steal it unconditionally, as a broken client would.
        rewrite(server, &name, &stolen);
    }
    let reason = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("lost fires");
    assert_eq!(
        reason,
        LostReason::TakenOver {
            holder: "agent-7".into()
        }
    );
    // And deleted (an operator removes the object): the next holder's renewal finds nothing.
    let guard = {
        let o = json!({"ownerId": null, "expiresAt": 0});
        rewrite(server, &name, &o);
        leasehold_testkit::take(&l, "job", Duration::from_secs(3)).await
    };
    assert!(guard.fence() > 0);
    let (code, _) = leasehold_testkit::servers::http_request(
        server.port,
        "DELETE",
        &format!(
            "/storage/v1/b/{}/o/{}",
            leasehold_testkit::gcs_server::BUCKET,
            name.replace('/', "%2F")
        ),
        &[],
        "",
    )
    .unwrap();
    assert!((200..300).contains(&code), "delete: {code}");
    let reason = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("lost fires");
    assert_eq!(reason, LostReason::Released);
}

/// Eight OS processes, 25 critical sections each, on one key: never two inside, the counter
/// reaches 200.
#[test]
fn eight_processes_never_overlap_and_count_to_200() {
    let server = shared_gcs();
    let url = server.store_url(&leasehold_testkit::prefix("count"));
    let work = tempfile::tempdir().unwrap();
    let t = Instant::now();
    leasehold_testkit::run_all(
        WORKER,
        &[
            "count",
            &url,
            "counter",
            "25",
            work.path().to_str().unwrap(),
        ],
        8,
        "two processes",
    );
    let count = std::fs::read_to_string(work.path().join("counter")).unwrap();
    assert_eq!(count.trim(), "200");
    eprintln!("8 × 25 critical sections in {:?}", t.elapsed());
}

/// The server hangs (SIGSTOP): renewals time out, and once the lease could have expired the
/// holder's `lost()` fires as unreachable, before its TTL is over; the store never says it still
/// holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_server_loses_the_lease_within_its_ttl() {
    let server = GcsServer::start();
    let url = format!("{}&timeout=200ms", server.store_url("hung"));
    let l = leasehold_testkit::connect_as(&url, "web-1").await;
    let guard = leasehold_testkit::take(&l, "job", Duration::from_millis(1500)).await;
    let t = Instant::now();
    server.pause();
    let reason = tokio::time::timeout(Duration::from_secs(3), guard.lost()).await;
    server.resume();
    let reason = reason.expect("lost fires");
    assert!(
        matches!(reason, LostReason::Unreachable { .. }),
        "{reason:?}"
    );
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t.elapsed()
    );
    assert!(!guard.is_current());
}

/// Labels that would make the object larger than the store reads back are refused at acquire,
/// at once, with a usage error naming the limit; nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_larger_than_the_read_limit_are_refused_at_acquire() {
    let server = shared_gcs();
    let prefix = leasehold_testkit::prefix("big");
    let l = leasehold_testkit::connect_as(&server.store_url(&prefix), "web-1").await;
    let err = l
        .lock("job")
        .unwrap()
        .label(
            "blob",
            "x".repeat(leasehold::stores::object::MAX_RECORD_BYTES),
        )
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, leasehold::Error::InvalidOption { name: "labels", .. }),
        "{err}"
    );
    let limit = leasehold::stores::object::LABEL_LIMIT.to_string();
    assert!(err.to_string().contains(&limit), "{err}");
    assert!(server.get_raw(&format!("{prefix}/job")).is_none());
}

/// fake-gcs-server itself carries out a DELETE whose `ifGenerationMatch` names a stale
/// generation: a lease renewed since is deleted. On such a server `cleanup` refuses to delete
/// anything, naming the store and why, and every record stays. Through the test kit's proxy,
/// which refuses such a DELETE as Cloud Storage does, cleanup removes the free record only and
/// leaves no scratch record behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_refuses_a_server_that_ignores_the_delete_precondition() {
    use leasehold::stores::gcs::{GcsOptions, GcsStore};
    use leasehold::{Inspection, LeaseRecord, RecordStore};
    let server = shared_gcs();
    let prefix = leasehold_testkit::prefix("stale-delete");

    // The emulator's own behaviour, through the store's client: a held lease, renewed, then a
    // delete conditioned on the generation before the renewal.
    let mut o = GcsOptions::new(leasehold_testkit::gcs_server::BUCKET);
    o.prefix = format!("{prefix}/raw/");
    o.endpoint = Some(server.raw_url());
    let raw = GcsStore::connect(o).await.unwrap();
    let key = Key::new("live").unwrap();
    let mut record = LeaseRecord::free("live", 0);
    record.holder = Some("web-1".into());
    record.token = Some("t1".into());
    record.expires_ms = leasehold::now_ms() + 60_000;
    record.ttl_ms = 60_000;
    let g1 = raw.create(&key, &record).await.unwrap().expect("created");
    record.renewed_ms = leasehold::now_ms();
    record.expires_ms = record.renewed_ms + 60_000;
    let g2 = raw
        .replace(&key, &record, &g1)
        .await
        .unwrap()
        .expect("renewed");
    assert_ne!(g1, g2);
    let deleted = raw.delete(&key, &g1).await.unwrap();
    eprintln!(
        "stale ifGenerationMatch={g1} DELETE of the lease at generation {g2}: deleted = {deleted}, object now {:?}",
        raw.get(&key).await.unwrap().map(|_| "present")
    );
    assert!(
        deleted && raw.get(&key).await.unwrap().is_none(),
        "fake-gcs-server refuses a stale conditional DELETE now: the test kit's proxy may go"
    );

    // cleanup over that server: refused, nothing deleted.
    let url = server.raw_store_url(&prefix);
    let l = leasehold_testkit::connect_as(&url, "web-1").await;
    let held = leasehold_testkit::take(&l, "held", Duration::from_secs(30)).await;
    leasehold_testkit::take(&l, "freed", Duration::from_secs(30))
        .await
        .release()
        .await
        .unwrap();
    let store = l.store();
    let res = store
        .cleanup(Duration::ZERO, &leasehold::CleanupProgress::new())
        .await;
    eprintln!("cleanup: {res:?}");
    let err = res.expect_err("cleanup refuses");
    assert!(
        matches!(
            err,
            leasehold::Error::Store {
                retryable: false,
                ..
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&store.describe()) && text.contains("ignores the precondition on DELETE"),
        "{text}"
    );
    for k in ["held", "freed"] {
        let seen = store.inspect(&Key::new(k).unwrap()).await.unwrap();
        assert!(matches!(seen, Some(Inspection::Record(_))), "{k}: {seen:?}");
    }
    assert!(held.is_current());

    // Through the proxy: the check passes, the free record goes, the held one stays.
    let store = leasehold::open_store(&server.store_url(&prefix))
        .await
        .unwrap();
    let report = store
        .cleanup(Duration::ZERO, &leasehold::CleanupProgress::new())
        .await
        .unwrap();
    assert_eq!((report.removed, report.kept), (1, 1), "{report:?}");
    let left: Vec<String> = (store.list("").await.unwrap().into_iter())
        .map(|i| match i {
            Inspection::Record(r) => r.key,
            Inspection::Corrupt { name, .. } => name,
        })
        .collect();
    assert_eq!(left, ["held"], "no scratch record left");
    assert!(held.is_current());
    held.release().await.unwrap();
}
