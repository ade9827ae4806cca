//! Semaphores and read-write locks on etcd: where its transactions keep the rules of
//! `decide/permits.rs` in subtle ways (the conformance suite checks the contracts): a
//! semaphore's count held by the slot keys under a race of separate clients, a waiting writer
//! registered ahead of new readers of other clients, the refusal of another kind, a key's kind
//! replaced once free, the permit keys as etcd shows them, and `cleanup` of kind keys.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::conformance::{expect_granted, expect_held, inspect_record, permit_request};
use leasehold::{AcquireOutcome, Error, Inspection, Key, LockStore, PermitRequest, ReleaseOutcome};
use leasehold_testkit::etcd_cluster::{shared_etcd, store_url};
use std::sync::Arc;
use std::time::Duration;

const TTL: Duration = Duration::from_secs(30);

/// A store of its own (its own client, sessions and held keys): another process, as far as the
/// keys are concerned.
async fn store() -> Arc<dyn LockStore> {
    leasehold::open_store(&store_url(shared_etcd()))
        .await
        .expect("etcd store")
}

fn key(name: &str) -> Key {
    Key::new(leasehold_testkit::prefix(name)).expect("key")
}

const SEM3: Option<PermitRequest> = Some(PermitRequest::Semaphore { permits: 3 });
const READ: Option<PermitRequest> = Some(PermitRequest::Read);
const WRITE: Option<PermitRequest> = Some(PermitRequest::Write);

/// The etcd keys under `prefix`, with their values, read with a client of the test's own.
async fn etcd_keys(prefix: &str) -> Vec<(String, String)> {
    let endpoint = format!("http://127.0.0.1:{}", shared_etcd().port);
    let mut c = etcd_client::Client::connect([endpoint], None)
        .await
        .expect("etcd");
    let got = c
        .get(prefix, Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .expect("get");
    got.kvs()
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                String::from_utf8_lossy(kv.value()).into_owned(),
            )
        })
        .collect()
}

/// Twenty separate clients race for a semaphore of three at once, each trying once: exactly
/// three are granted (the slot keys bound them, whatever each client read before), the record
/// and etcd show those three, and their fences differ.
#[tokio::test]
async fn a_semaphore_of_three_grants_three_of_twenty_racing_clients() {
    let k = key("sem-race");
    let mut stores = vec![];
    for _ in 0..20 {
        stores.push(store().await);
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(stores.len()));
    let mut tasks = vec![];
    for (i, s) in stores.iter().enumerate() {
        let (s, k, barrier) = (s.clone(), k.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let req = permit_request(&k, &format!("c{i}"), SEM3);
            barrier.wait().await;
            s.acquire(&req).await
        }));
    }
    let mut fences = vec![];
    let mut holders = vec![];
    for t in tasks {
        match t.await.expect("task") {
            Ok(AcquireOutcome::Granted(r)) => {
                fences.push(r.fence);
                holders.push(r.holder.expect("holder"));
            }
            Ok(AcquireOutcome::Held(_)) => {}
            // The race may outlast a client's attempts; it is then told to try again.
            Err(e) => assert!(e.is_retryable(), "{e}"),
        }
    }
    assert!(fences.len() <= 3, "{} holders of 3 permits", fences.len());
    let t = inspect_record(&stores[0], &k)
        .await
        .permits
        .expect("a permit table");
    let mut shown: Vec<String> = t.holders.iter().map(|p| p.holder.clone()).collect();
    shown.sort();
    holders.sort();
    assert_eq!(shown, holders, "the record shows the granted holders");
    let slots = etcd_keys(&format!("leasehold/permit/{}\0", k.as_str())).await;
    assert_eq!(slots.len(), holders.len(), "{slots:?}");
    fences.sort_unstable();
    fences.dedup();
    assert_eq!(fences.len(), holders.len(), "one fence per permit");
    // Whoever did not get one gets one now that the race is over, up to three in all.
    for (i, s) in stores.iter().enumerate() {
        let req = permit_request(&k, &format!("late-{i}"), SEM3);
        match s.acquire(&req).await.expect("acquire") {
            AcquireOutcome::Granted(_) => holders.push(req.holder),
            AcquireOutcome::Held(r) => {
                assert_eq!(holders.len(), 3, "refused below 3 holders: {r:?}");
                break;
            }
        }
    }
    assert_eq!(holders.len(), 3);
    for s in &stores {
        s.force_release(&k).await.expect("force release");
    }
}

/// A writer of one client that waits registers as the key's waiter (its kind `write`): a reader
/// of another client is then refused while the first reader holds, the writer gets it when the
/// reader leaves, and once the writer withdraws instead, readers come in again.
#[tokio::test]
async fn a_waiting_writer_of_one_client_holds_back_the_readers_of_another() {
    let (a, b, c) = (store().await, store().await, store().await);
    let k = key("writer-waits");
    let r1 = expect_granted(&a, &permit_request(&k, "r1", READ)).await;
    let mut w = permit_request(&k, "w", WRITE);
    w.waiter_ttl = Some(TTL);
    let seen = expect_held(&b, &w).await;
    assert_eq!(seen.waiter.as_deref(), Some("w"));
    let waiter = etcd_keys(&format!("leasehold/waiter/{}", k.as_str())).await;
    assert!(
        waiter.len() == 1 && waiter[0].1.contains("\"permit\":\"write\""),
        "{waiter:?}"
    );
    let t = inspect_record(&c, &k)
        .await
        .permits
        .expect("a permit table");
    assert_eq!(t.writers_waiting, [w.token.clone()]);
    // A new reader, of a third client: held back although only readers hold.
    expect_held(&c, &permit_request(&k, "r2", READ)).await;
    assert_eq!(
        a.release(&k, r1.token.as_deref().unwrap()).await.unwrap(),
        ReleaseOutcome::Released
    );
    let wr = expect_granted(&b, &w).await;
    assert!(wr.fence > r1.fence);
    assert!(
        etcd_keys(&format!("leasehold/waiter/{}", k.as_str()))
            .await
            .is_empty(),
        "the grant removed the registration"
    );
    expect_held(&c, &permit_request(&k, "r2", READ)).await;
    b.release(&k, &w.token).await.unwrap();
    // A writer that waits and then withdraws: readers are no longer held back.
    let r3 = expect_granted(&a, &permit_request(&k, "r3", READ)).await;
    let mut w2 = permit_request(&k, "w2", WRITE);
    w2.waiter_ttl = Some(TTL);
    expect_held(&b, &w2).await;
    expect_held(&c, &permit_request(&k, "r4", READ)).await;
    b.withdraw_waiter(&k, &w2.token).await.unwrap();
    let r4 = expect_granted(&c, &permit_request(&k, "r4", READ)).await;
    assert!(r4.fence > r3.fence);
    a.force_release(&k).await.unwrap();
}

/// Another kind is refused while a permit is held (by the transaction's compare of the kind key
/// and, for a lock, of the empty permit prefix), with the text every store uses; once free, the
/// key takes the kind asked and `cleanup` leaves its kind key only while it is used.
#[tokio::test]
async fn other_kinds_are_refused_and_kind_keys_are_cleaned_up() {
    let (a, b) = (store().await, store().await);
    let k = key("kinds");
    let first = expect_granted(&a, &permit_request(&k, "a", SEM3)).await;
    let refused = |r: leasehold::Result<AcquireOutcome>, is: &str, asked: &str| match r {
        Err(Error::InvalidOption {
            name: "permits",
            reason,
        }) => {
            assert!(reason.contains(&format!("is {is}, with")), "{reason}");
            assert!(
                reason.contains(&format!("asked for as {asked}")),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    };
    let sem3 = "a semaphore of 3 permits";
    refused(
        b.acquire(&permit_request(
            &k,
            "b",
            Some(PermitRequest::Semaphore { permits: 2 }),
        ))
        .await,
        sem3,
        "a semaphore of 2 permits",
    );
    refused(
        b.acquire(&permit_request(&k, "b", READ)).await,
        sem3,
        "a read-write lock",
    );
    refused(
        b.acquire(&permit_request(&k, "b", None)).await,
        sem3,
        "a lock",
    );
    let kind = format!("leasehold/kind/{}", k.as_str());
    assert_eq!(etcd_keys(&kind).await[0].1, "semaphore:3");
    // The kind key stays while a permit is held.
    b.cleanup(Duration::ZERO, &leasehold::CleanupProgress::new())
        .await
        .unwrap();
    assert_eq!(etcd_keys(&kind).await.len(), 1);
    a.release(&k, first.token.as_deref().unwrap())
        .await
        .unwrap();
    // A lock on the free key, refusing permits while held.
    let lock = expect_granted(&b, &permit_request(&k, "b", None)).await;
    assert!(lock.fence > first.fence);
    refused(
        a.acquire(&permit_request(&k, "a", SEM3)).await,
        "a lock",
        sem3,
    );
    b.release(&k, lock.token.as_deref().unwrap()).await.unwrap();
    // Then a read-write lock: its kind key replaced.
    let w = expect_granted(&a, &permit_request(&k, "a", WRITE)).await;
    assert!(w.fence > lock.fence);
    assert_eq!(etcd_keys(&kind).await[0].1, "read-write");
    a.release(&k, w.token.as_deref().unwrap()).await.unwrap();
    let report = b
        .cleanup(Duration::ZERO, &leasehold::CleanupProgress::new())
        .await
        .unwrap();
    assert!(report.removed >= 1, "{report:?}");
    assert!(etcd_keys(&kind).await.is_empty());
    assert!(a.inspect(&k).await.unwrap().is_none(), "nothing left");
}

/// `list` shows a key's permits with their fences; a release deletes its permit key.
#[tokio::test]
async fn a_permit_is_listed_and_its_keys_are_gone_on_release() {
    let a = store().await;
    let k = key("listed");
    let p = expect_granted(&a, &permit_request(&k, "a", SEM3)).await;
    let q = expect_granted(&a, &permit_request(&k, "b", SEM3)).await;
    let listed = a.list(k.as_str()).await.unwrap();
    let rec = listed
        .iter()
        .find_map(|i| match i {
            Inspection::Record(r) if r.key == k.as_str() => Some(r),
            _ => None,
        })
        .expect("listed");
    let t = rec.permits.as_ref().expect("a permit table");
    let fences: Vec<u64> = t.holders.iter().map(|p| p.fence).collect();
    assert_eq!(fences, [p.fence, q.fence]);
    for r in [p, q] {
        a.release(&k, r.token.as_deref().unwrap()).await.unwrap();
    }
    assert!(etcd_keys(&format!("leasehold/permit/{}\0", k.as_str()))
        .await
        .is_empty());
}

/// The registered waiter of a full semaphore is ahead of newcomers: when one permit comes free,
/// a newcomer of another client is refused (its grant would have to leave a slot for the
/// waiter), the waiter is granted, and its registration goes with its grant.
#[tokio::test]
async fn a_freed_permit_goes_to_the_registered_waiter_not_to_a_newcomer() {
    let (a, b) = (store().await, store().await);
    let k = key("waiter-first");
    let mut held_now = vec![];
    for who in ["p1", "p2", "p3"] {
        held_now.push(expect_granted(&a, &permit_request(&k, who, SEM3)).await);
    }
    let mut d = permit_request(&k, "d", SEM3);
    d.waiter_ttl = Some(TTL);
    let seen = expect_held(&b, &d).await;
    assert_eq!(seen.waiter.as_deref(), Some("d"));
    assert!(
        seen.holder.as_deref().is_some_and(|h| h.contains("3 of 3")),
        "{seen:?}"
    );
    let freed = held_now.pop().unwrap();
    a.release(&k, freed.token.as_deref().unwrap())
        .await
        .unwrap();
    expect_held(&a, &permit_request(&k, "newcomer", SEM3)).await;
    let got = expect_granted(&b, &d).await;
    assert!(got.fence > freed.fence);
    let r = inspect_record(&a, &k).await;
    assert_eq!(r.waiter, None, "the grant removed the registration");
    assert_eq!(r.permits.expect("a permit table").holders.len(), 3);
    a.force_release(&k).await.unwrap();
}
