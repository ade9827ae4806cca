//! The etcd store with real servers and real faults: the leader killed (SIGKILL) while leases are
//! held and contended, two of three members killed, a holder partitioned from etcd.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::Locks;
use leasehold_testkit::etcd_cluster::{shared_etcd, store_url, EtcdCluster};
use leasehold_testkit::proxy::TcpProxy;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Four processes (each its own store and session) race on one key while a fifth holds ten
/// leases; the leader is killed with SIGKILL. A new leader is elected, the race goes on, and
/// never are two holders inside at once; fences strictly increase in the order holders entered.
/// The held leases are renewed through the failover or reported lost — never silently doubled:
/// a contender gets one only after its holder's `lost()` fired.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_leader_killed_while_leases_are_held_and_contended() {
    let mut cluster = EtcdCluster::start(3);
    let url = cluster.url();
    let holder = leasehold_testkit::connect_as(&url, "holder").await;
    let mut held = vec![];
    for i in 0..10 {
        let g = holder
            .lock(format!("held/{i}"))
            .unwrap()
            .ttl(Duration::from_secs(3))
            .try_acquire()
            .await
            .unwrap()
            .expect("free");
        held.push(g);
    }
    let inside = Arc::new(AtomicBool::new(false));
    let entered = Arc::new(Mutex::new(Vec::<(u64, Instant)>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = vec![];
    for w in 0..4 {
        let l = leasehold_testkit::connect_as(&url, &format!("w{w}")).await;
        let (inside, entered, stop) = (inside.clone(), entered.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let got = l
                    .lock("contended")
                    .unwrap()
                    .ttl(Duration::from_secs(2))
                    .wait(Duration::from_secs(20))
                    .acquire()
                    .await;
                let Ok(g) = got else { continue };
                assert!(!inside.swap(true, Ordering::SeqCst), "two holders inside");
                entered.lock().unwrap().push((g.fence(), Instant::now()));
                tokio::time::sleep(Duration::from_millis(5)).await;
                inside.store(false, Ordering::SeqCst);
                let _ = g.release().await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    let leader = cluster.leader().expect("a leader");
    let before = entered.lock().unwrap().len();
    assert!(before > 0, "no grant before the kill");
    let killed = Instant::now();
    cluster.kill(leader);
    // A new leader among the two others.
    let deadline = Instant::now() + Duration::from_secs(15);
    let new_leader = loop {
        if let Some(l) = cluster.leader().filter(|l| *l != leader) {
            break l;
        }
        assert!(Instant::now() < deadline, "no new leader");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The race goes on after the failover.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let after = entered
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, at)| *at > killed)
            .count();
        if after >= 10 {
            break;
        }
        assert!(Instant::now() < deadline, "{after} grants after the kill");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.expect("worker");
    }
    let fences: Vec<u64> = entered.lock().unwrap().iter().map(|(f, _)| *f).collect();
    for pair in fences.windows(2) {
        assert!(pair[1] > pair[0], "fence {} after {}", pair[1], pair[0]);
    }
    // Each held lease is either still ours, or lost before anyone else got it.
    let other = leasehold_testkit::connect_as(&url, "other").await;
    for (i, g) in held.iter().enumerate() {
        let taken = other
            .lock(format!("held/{i}"))
            .unwrap()
            .try_acquire()
            .await
            .unwrap();
        if let Some(t) = taken {
            assert!(
                !g.is_current(),
                "held/{i} granted to another while its holder still holds it"
            );
            t.release().await.unwrap();
        }
    }
    eprintln!(
        "leader m{leader} killed; m{new_leader} leads; {before} grants before, {} in all; {} of 10 held leases still held",
        fences.len(),
        held.iter().filter(|g| g.is_current()).count()
    );
}

/// With two of three members killed, acquiring fails with a retryable error naming the members,
/// within a few seconds.
#[tokio::test]
async fn two_of_three_members_down_fails_naming_them() {
    let mut cluster = EtcdCluster::start(3);
    let l = leasehold_testkit::connect_as(&format!("{}?timeout=1s", cluster.url()), "a").await;
    leasehold_testkit::taken_and_released(&l).await;
    let leader = cluster.leader().expect("a leader");
    let other = (0..3).find(|i| *i != leader).unwrap();
    cluster.kill(leader);
    cluster.kill(other);
    let t = Instant::now();
    let err = l
        .lock("job")
        .unwrap()
        .try_acquire()
        .await
        .expect_err("no quorum");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(err.is_retryable(), "{err}");
    let msg = err.to_string();
    for port in &cluster.ports {
        assert!(msg.contains(&format!("127.0.0.1:{port}")), "{msg}");
    }
}

/// A holder cut off from etcd (its only connection goes through a proxy that stops forwarding):
/// its renewals fail, and every guard's `lost()` fires before another process — connected
/// directly — is granted any of its keys (etcd frees them when the session lease expires).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partitioned_holder_stops_before_anyone_else_gets_its_keys() {
    let server = shared_etcd();
    let proxy = TcpProxy::start(server.port);
    let cut = leasehold_testkit::connect_as(
        &format!("etcd://127.0.0.1:{}?timeout=500ms", proxy.port),
        "cut",
    )
    .await;
    let direct: Locks = leasehold_testkit::connect_as(&store_url(server), "direct").await;
    let stem = leasehold_testkit::prefix("partition");
    let guards = leasehold_testkit::take_many(&cut, &stem, 20, Duration::from_millis(1500)).await;
    let lost_at = Arc::new(Mutex::new(vec![None::<Instant>; guards.len()]));
    let mut watchers = vec![];
    for (i, g) in guards.into_iter().enumerate() {
        let lost_at = lost_at.clone();
        watchers.push(tokio::spawn(async move {
            let reason = g.lost().await;
            lost_at.lock().unwrap()[i] = Some(Instant::now());
            reason
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.pause();
    let cut_at = Instant::now();
    let mut takers = vec![];
    for i in 0..20 {
        let l = direct.clone();
        let key = format!("{stem}/{i}");
        takers.push(tokio::spawn(async move {
            let g = l
                .lock(&key)
                .unwrap()
                .wait(Duration::from_secs(15))
                .acquire()
                .await
                .expect("granted once the cut holder's session expired");
            (Instant::now(), g)
        }));
    }
    for (i, t) in takers.into_iter().enumerate() {
        let (granted, g) = t.await.unwrap();
        let lost = lost_at.lock().unwrap()[i].expect("lost() fired before the grant");
        assert!(
            lost < granted,
            "key {i}: granted before its holder's lost()"
        );
        assert!(lost > cut_at);
        g.release().await.unwrap();
    }
    for w in watchers {
        let reason = w.await.unwrap();
        assert!(
            !reason.is_gone() || reason == leasehold::LostReason::Expired,
            "{reason:?}"
        );
    }
    proxy.resume();
}

const WORKER: &str = env!("CARGO_BIN_EXE_leasehold-worker");

/// Six processes on a 3-member cluster, 25 critical sections each on one key: never two inside
/// at once, and every increment of the file counter lands.
#[test]
fn six_processes_on_three_members_count_to_150() {
    let cluster = EtcdCluster::start(3);
    let work = tempfile::tempdir().unwrap();
    let t = Instant::now();
    leasehold_testkit::run_all(
        WORKER,
        &[
            "count",
            &cluster.url(),
            "counter",
            "25",
            work.path().to_str().unwrap(),
        ],
        6,
        "two processes",
    );
    let count = std::fs::read_to_string(work.path().join("counter")).unwrap();
    assert_eq!(count.trim(), "150");
    eprintln!("6 × 25 critical sections in {:?}", t.elapsed());
}

/// A holder process killed with SIGKILL: its key goes when its session lease expires (a TTL of
/// 1 s has a session of 3 s), and the next holder's fence is higher.
#[tokio::test]
async fn a_holder_killed_with_sigkill_frees_its_key_with_its_session() {
    use std::io::BufRead;
    let url = store_url(shared_etcd());
    let key = leasehold_testkit::prefix("killed");
    let mut child = std::process::Command::new(WORKER)
        .args(["hold", &url, &key, "1000"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let fence: u64 = line.trim().strip_prefix("held ").unwrap().parse().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let killed = Instant::now();
    let l = leasehold_testkit::connect_as(&url, "next").await;
    let g = l
        .lock(&key)
        .unwrap()
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("freed with the session");
    let took = killed.elapsed();
    assert!(took < Duration::from_millis(4500), "took {took:?}");
    assert!(g.fence() > fence);
    g.release().await.unwrap();
}
