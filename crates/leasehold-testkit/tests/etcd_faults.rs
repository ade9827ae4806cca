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

/// A holder process of a permit killed with SIGKILL: its permit key goes when its session lease
/// expires (a TTL of 1 s has a session of 3 s) while the other permit stays held, and the next
/// permit's fence is higher.
#[tokio::test]
async fn a_permit_holder_killed_with_sigkill_frees_its_permit_with_its_session() {
    use std::io::BufRead;
    let url = store_url(shared_etcd());
    let key = leasehold_testkit::prefix("killed-permit");
    let other = leasehold_testkit::connect_as(&url, "other").await;
    let kept = other
        .semaphore(&key, 2)
        .unwrap()
        .ttl(Duration::from_secs(5))
        .try_acquire()
        .await
        .unwrap()
        .expect("a permit of two is free");
    let mut child = std::process::Command::new(WORKER)
        .args(["hold", &url, &key, "1000", "2"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let fence: u64 = line.trim().strip_prefix("held ").unwrap().parse().unwrap();
    let l = leasehold_testkit::connect_as(&url, "next").await;
    assert!(
        l.semaphore(&key, 2)
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "both permits are held"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let killed = Instant::now();
    let g = l
        .semaphore(&key, 2)
        .unwrap()
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("freed with the session");
    let took = killed.elapsed();
    assert!(took < Duration::from_millis(4500), "took {took:?}");
    assert!(g.fence() > fence);
    assert!(kept.is_current(), "the other holder keeps its permit");
    g.release().await.unwrap();
    kept.release().await.unwrap();
}

/// A store that lets each `acquire` call through only when the test says so, counting the calls
/// that reached it; everything else goes straight to the store it wraps. It changes no answer: it
/// only decides when the client's next attempt is sent.
#[derive(Debug, Clone)]
struct Paced {
    inner: Arc<dyn leasehold::LockStore>,
    /// Acquire calls that reached it.
    arrived: Arc<tokio::sync::watch::Sender<usize>>,
    /// Acquire calls it lets through (counted as `arrived` is).
    allowed: Arc<tokio::sync::watch::Sender<usize>>,
}

impl Paced {
    fn new(inner: Arc<dyn leasehold::LockStore>) -> Self {
        Paced {
            inner,
            arrived: Arc::new(tokio::sync::watch::channel(0).0),
            allowed: Arc::new(tokio::sync::watch::channel(0).0),
        }
    }

    /// Waits until the `n`th acquire call reached it.
    async fn arrived(&self, n: usize) {
        let mut seen = self.arrived.subscribe();
        let reached = tokio::time::timeout(Duration::from_secs(10), seen.wait_for(|c| *c >= n));
        assert!(
            matches!(reached.await, Ok(Ok(_))),
            "acquire call {n} never came"
        );
    }

    /// Lets acquire calls through up to the `n`th.
    fn allow(&self, n: usize) {
        self.allowed.send_replace(n);
    }
}

#[async_trait::async_trait]
impl leasehold::LockStore for Paced {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn capabilities(&self) -> leasehold::Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(
        &self,
        req: &leasehold::AcquireRequest,
    ) -> leasehold::Result<leasehold::AcquireOutcome> {
        let mut n = 0;
        self.arrived.send_modify(|c| {
            *c += 1;
            n = *c;
        });
        let mut allowed = self.allowed.subscribe();
        allowed.wait_for(|a| *a >= n).await.unwrap();
        self.inner.acquire(req).await
    }
    async fn renew(
        &self,
        key: &leasehold::Key,
        token: &str,
        ttl: Duration,
    ) -> leasehold::Result<leasehold::RenewOutcome> {
        self.inner.renew(key, token, ttl).await
    }
    async fn release(
        &self,
        key: &leasehold::Key,
        token: &str,
    ) -> leasehold::Result<leasehold::ReleaseOutcome> {
        self.inner.release(key, token).await
    }
    async fn withdraw_waiter(&self, key: &leasehold::Key, token: &str) -> leasehold::Result<()> {
        self.inner.withdraw_waiter(key, token).await
    }
    async fn inspect(
        &self,
        key: &leasehold::Key,
    ) -> leasehold::Result<Option<leasehold::Inspection>> {
        self.inner.inspect(key).await
    }
    async fn list(&self, prefix: &str) -> leasehold::Result<Vec<leasehold::Inspection>> {
        self.inner.list(prefix).await
    }
    async fn force_release(
        &self,
        key: &leasehold::Key,
    ) -> leasehold::Result<Option<leasehold::LeaseRecord>> {
        self.inner.force_release(key).await
    }
    async fn cleanup(
        &self,
        older_than: Duration,
        progress: &leasehold::CleanupProgress,
    ) -> leasehold::Result<leasehold::CleanupReport> {
        self.inner.cleanup(older_than, progress).await
    }
    async fn subscribe(
        &self,
        key: &leasehold::Key,
    ) -> leasehold::Result<Option<Box<dyn leasehold::ChangeWatch>>> {
        self.inner.subscribe(key).await
    }
    async fn notify_release(
        &self,
        key: &leasehold::Key,
        fence: Option<u64>,
    ) -> leasehold::Result<bool> {
        self.inner.notify_release(key, fence).await
    }
}

/// An acquire whose answer is lost (held in the proxy past the store's `?timeout=`, which is
/// longer than the TTL, as in a slow leader change): the write was done, so the store cleans it
/// up in the background — while the acquisition's retry, with the same owner token, finds that
/// same write. The clean-up's request goes out first (by 0 to 40 ms; 0 lets them race) and its
/// answer comes first (the proxy hands the held answers over one at a time), the retry's answer
/// right after. Fifty times, on a key another holder has just released (every other time the
/// first is a registered waiter): the first process's guard, once granted, is current and its
/// record is there, and a second process trying the key at that moment is never granted it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_acquire_answer_is_never_both_cleaned_up_and_adopted() {
    use std::io::{BufRead, Write};
    const TTL: Duration = Duration::from_millis(400);
    let server = shared_etcd();
    let direct = store_url(server);
    let proxy = TcpProxy::start(server.port);
    let url = format!("etcd://127.0.0.1:{}?timeout=600ms", proxy.port);
    let paced = Paced::new(leasehold::open_store(&url).await.unwrap());
    let first = Locks::new(paced.clone())
        .with_holder(leasehold::HolderId::new("first"))
        .with_local_layer(false);
    let other = leasehold_testkit::connect_as(&direct, "other").await;
    let stem = leasehold_testkit::prefix("unanswered");
    let mut probe = std::process::Command::new(WORKER)
        .args(["probe", &direct, &stem, &TTL.as_millis().to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut ask = probe.stdin.take().unwrap();
    let mut answers = std::io::BufReader::new(probe.stdout.take().unwrap()).lines();
    for i in 0..50u64 {
        let key = format!("{stem}/{i}");
        let held = leasehold_testkit::take(&other, &key, Duration::from_secs(30)).await;
        let calls = *paced.arrived.borrow();
        let waiting = first
            .lock(&key)
            .unwrap()
            .ttl(TTL)
            .register_waiter(i % 2 == 1)
            .wait(Duration::from_secs(10))
            .acquire();
        let waiting = tokio::spawn(waiting);
        // Its first attempt finds the key held; it subscribes and comes back.
        paced.allow(calls + 1);
        paced.arrived(calls + 2).await;
        held.release().await.unwrap();
        // The attempt that creates the record: its answer is held.
        proxy.hold_answers();
        paced.allow(calls + 2);
        // It failed (no answer within 600 ms) and is tried again; the clean-up of what it may
        // have written started as it failed. A moment for the clean-up's request to go out first.
        paced.arrived(calls + 3).await;
        tokio::time::sleep(Duration::from_millis(10 * (i % 5))).await;
        // The retry, and any attempt after it.
        paced.allow(usize::MAX);
        // The retry's request reaches etcd; then the answers go, 5 ms apart.
        tokio::time::sleep(Duration::from_millis(50)).await;
        proxy.release_answers(Duration::from_millis(5));
        let g = match waiting.await.unwrap() {
            Ok(g) => g,
            Err(e) => panic!("iteration {i}: the first process got no lease: {e}"),
        };
        paced.allow(0);
        writeln!(ask, "{i}").unwrap();
        let said = answers.next().unwrap().unwrap();
        assert!(
            said.starts_with("busy"),
            "iteration {i}: a second process was granted {key} ({said}) while the first \
             process's guard (fence {}) is current: {}",
            g.fence(),
            g.is_current()
        );
        if !g.is_current() {
            panic!(
                "iteration {i}: the first guard lost its lease at once: {}",
                g.lost().await
            );
        }
        let record = other
            .store()
            .inspect(&leasehold::Key::new(&key).unwrap())
            .await
            .unwrap();
        assert!(
            matches!(&record, Some(leasehold::Inspection::Record(r)) if r.holder.as_deref() == Some("first")),
            "iteration {i}: the record is not the first process's: {record:?}"
        );
        g.release().await.unwrap();
    }
    drop(ask);
    probe.wait().unwrap();
}
