//! What the store keeps: labels, hostile keys, inspect, list and cleanup.

use super::*;

/// Nothing is written that cannot be read back whole: labels far over any store's limit (2 MiB)
/// are refused with `InvalidOption` `labels`, or granted and read back byte for byte; labels
/// that JSON must escape (control characters, quotes, non-ASCII) round-trip.
pub async fn labels_are_read_back_whole(store: Arc<dyn LockStore>) {
    let locks = client(&store, "a");
    let p = prefix("labels");
    let big = "x".repeat(2 << 20);
    let key = format!("{p}/big");
    match locks
        .lock(&key)
        .unwrap()
        .label("blob", big.clone())
        .try_acquire()
        .await
    {
        Err(Error::InvalidOption {
            name: "labels",
            reason,
        }) => {
            assert!(reason.contains("at most"), "{reason}");
            assert!(store
                .inspect(&Key::new(&key).unwrap())
                .await
                .unwrap()
                .is_none());
        }
        Ok(Some(g)) => {
            match store.inspect(g.key()).await.unwrap() {
                Some(Inspection::Record(r)) => {
                    assert!(r.labels.get("blob") == Some(&big), "read back cut")
                }
                other => panic!("2 MiB of label read back as {other:?}"),
            }
            g.release().await.unwrap();
        }
        other => panic!("2 MiB of label: {other:?}"),
    }
    let odd = "\u{1}\"\\\n\té\u{10FFFF}".repeat(500);
    let g = locks
        .lock(format!("{p}/odd"))
        .unwrap()
        .label("odd", odd.clone())
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    match store.inspect(g.key()).await.unwrap() {
        Some(Inspection::Record(r)) => assert_eq!(r.labels.get("odd"), Some(&odd)),
        other => panic!("escaped labels read back as {other:?}"),
    }
    g.release().await.unwrap();
}

/// Hostile keys are refused with a typed error or handled safely; never a panic.
pub async fn hostile_keys(store: Arc<dyn LockStore>) {
    for bad in ["", "a\0b", "a\nb"] {
        assert!(
            matches!(Key::new(bad), Err(Error::InvalidKey { .. })),
            "{bad:?} accepted"
        );
    }
    assert!(matches!(
        Key::new("x".repeat(10 * 1024)),
        Err(Error::InvalidKey { .. })
    ));
    assert!(matches!(
        Key::from_bytes(b"\xff\xfe"),
        Err(Error::InvalidKey { .. })
    ));
    let locks = client(&store, "a");
    assert!(matches!(locks.lock(""), Err(Error::InvalidKey { .. })));
    let p = prefix("hostile");
    let long = format!("{p}/{}", "y".repeat(900));
    let odd = [
        format!("{p}/../x"),
        format!("{p}/../../etc/passwd"),
        format!("{p}/.."),
        format!("{p}/ä ö/🔒"),
        format!("{p}/a\\b"),
        format!("{p}/--0123456789abcdef0123456789abcdef"),
        long,
    ];
    let mut fences = vec![];
    for s in &odd {
        let k = Key::new(s).expect("valid key");
        let g = locks
            .lock_key(k.clone())
            .try_acquire()
            .await
            .expect("acquire")
            .expect("free");
        fences.push(g.fence());
        match store.inspect(&k).await.expect("inspect") {
            Some(Inspection::Record(r)) => assert_eq!(&r.key, s),
            other => panic!("inspect {s:?}: {other:?}"),
        }
        g.release().await.expect("release");
    }
    // Distinct keys are distinct locks.
    let a = locks
        .lock(&odd[0])
        .expect("k")
        .try_acquire()
        .await
        .expect("a")
        .expect("free");
    let b = locks
        .lock(&odd[1])
        .expect("k")
        .try_acquire()
        .await
        .expect("b");
    assert!(b.is_some(), "two keys share one lock");
    a.release().await.expect("release");
    if let Some(b) = b {
        b.release().await.expect("release");
    }
}

/// Operators see holder, fence and expiry; list filters by prefix; cleanup keeps held records.
pub async fn inspect_list_cleanup(store: Arc<dyn LockStore>) {
    let p = prefix("ls");
    let locks = client(&store, "lister");
    let held = locks
        .lock(format!("{p}/held"))
        .expect("k")
        .label("task", "42")
        .try_acquire()
        .await
        .expect("a")
        .expect("free");
    let freed = locks
        .lock(format!("{p}/freed"))
        .expect("k")
        .try_acquire()
        .await
        .expect("a")
        .expect("free");
    freed.release().await.expect("release");
    let list = store.list(&p).await.expect("list");
    let keys: Vec<&str> = list
        .iter()
        .filter_map(|i| match i {
            Inspection::Record(r) => Some(r.key.as_str()),
            Inspection::Corrupt { .. } => None,
        })
        .collect();
    // Free records stay (keeping their fence) except on stores whose records expire server-side.
    let expected = if store.capabilities().native_ttl {
        1
    } else {
        2
    };
    assert_eq!(keys.len(), expected, "{list:?}");
    assert!(keys.contains(&format!("{p}/held").as_str()));
    assert!(store.list(&format!("{p}/h")).await.expect("list").len() == 1);
    let Some(Inspection::Record(r)) = store.inspect(held.key()).await.expect("inspect") else {
        panic!("no record")
    };
    assert_eq!(r.holder.as_deref(), Some("lister"));
    assert_eq!(r.fence, held.fence());
    assert!(r.expires_ms > crate::record::now_ms());
    assert_eq!(r.labels.get("task").map(String::as_str), Some("42"));
    store
        .cleanup(Duration::ZERO, &crate::store::CleanupProgress::new())
        .await
        .expect("cleanup");
    assert!(
        store.inspect(held.key()).await.expect("inspect").is_some(),
        "cleanup removed a held lease"
    );
    assert!(held.is_current());
    held.release().await.expect("release");
}
