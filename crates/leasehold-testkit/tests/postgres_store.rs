//! The PostgreSQL lock store against real servers: exclusion across 8 OS processes, fences that
//! keep rising after `cleanup` deleted a key's row, a crash-restart of the server while a lease is
//! held and waited for, renewals batched into one statement, the table's parameters, a user
//! without CREATE, labels the table cannot hold; semaphores and read-write locks (a decision on
//! a stale snapshot judged again, renewals batched with the locks', notifications, cleanup and
//! force-release of permit keys, a table of an earlier version brought up to date).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::{
    AcquireOutcome, AcquireRequest, Error, HolderId, Inspection, Key, LockStore, LostReason,
    PermitRequest, ReleaseOutcome, RenewOutcome,
};
use leasehold_testkit::servers::{shared_postgres, PostgresServer};
use std::sync::Arc;
use std::time::{Duration, Instant};

const WORKER: &str = env!("CARGO_BIN_EXE_leasehold-worker");

/// The database of a URL (`postgres://…/DB[?…]`).
fn db_of(url: &str) -> &str {
    let path = url.rsplit('/').next().unwrap_or_default();
    path.split('?').next().unwrap_or_default()
}

async fn store(url: &str) -> Arc<dyn LockStore> {
    leasehold::open_store(url).await.unwrap()
}

#[test]
fn eight_processes_never_overlap_and_count_to_200() {
    let url = shared_postgres().fresh_db();
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

/// `cleanup` deletes free rows, and the next grant of the key is still fenced above every
/// earlier one (a block of fences included): fences come from a sequence no deletion lowers.
#[tokio::test]
async fn fences_keep_rising_after_cleanup_deleted_the_row() {
    let url = shared_postgres().fresh_db();
    let s = store(&url).await;
    let key = Key::new("job/1").unwrap();
    let mut req = AcquireRequest::new(key.clone(), "a", Duration::from_secs(30));
    req.fences = 500;
    let AcquireOutcome::Granted(first) = s.acquire(&req).await.unwrap() else {
        panic!("free")
    };
    s.release(&key, &req.token).await.unwrap();
    let report = s
        .cleanup(Duration::ZERO, &leasehold::CleanupProgress::new())
        .await
        .unwrap();
    assert_eq!(report.removed, 1);
    assert!(s.inspect(&key).await.unwrap().is_none(), "the row is gone");
    let again = AcquireRequest::new(key.clone(), "b", Duration::from_secs(30));
    let AcquireOutcome::Granted(second) = s.acquire(&again).await.unwrap() else {
        panic!("free")
    };
    assert!(
        second.fence > first.fence,
        "fence went from {} to {} after cleanup",
        first.fence,
        second.fence
    );
    // A second store on the same table (another process) continues from the same sequence.
    let other = store(&url).await;
    other.release(&key, &again.token).await.unwrap();
    other
        .cleanup(Duration::ZERO, &leasehold::CleanupProgress::new())
        .await
        .unwrap();
    let third = AcquireRequest::new(key.clone(), "c", Duration::from_secs(30));
    let AcquireOutcome::Granted(r) = other.acquire(&third).await.unwrap() else {
        panic!("free")
    };
    assert!(r.fence > second.fence);
}

/// The server crashes and restarts (a backend killed with SIGKILL: the postmaster ends every
/// connection, recovers from its WAL and accepts connections again) while `a` holds a lease and
/// `b` waits for it. `a` keeps its lease (renewals retry and connect again within its TTL),
/// `b` does not get it meanwhile; once `a` releases, `b` gets it — woken by the release's
/// notification on its new connection, not by its timer — with a higher fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_crash_restart_keeps_leases_and_wakes_waiters() {
    let server = PostgresServer::start();
    let url = server.fresh_db();
    let db = db_of(&url).to_owned();
    let (sa, sb) = (store(&url).await, store(&url).await);
    let a = leasehold::Locks::from_arc(sa).with_holder(HolderId::new("a"));
    let b = leasehold::Locks::from_arc(sb).with_holder(HolderId::new("b"));
    let ttl = Duration::from_secs(3);
    let ga = a.lock("hot").unwrap().ttl(ttl).acquire().await.unwrap();
    let waiter = tokio::spawn(async move {
        b.lock("hot")
            .unwrap()
            .ttl(ttl)
            .wait(Duration::from_secs(30))
            .acquire()
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed = server.psql(
        &db,
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
         AND pid <> pg_backend_pid() LIMIT 1",
    );
    let pid: i32 = killed.unwrap().parse().unwrap();
    // SAFETY: kill(2) on a backend of the server this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let back = Instant::now();
    while server.psql(&db, "SELECT 1").as_deref() != Some("1") {
        assert!(back.elapsed() < Duration::from_secs(20), "server not back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("server back after {:?}", back.elapsed());
    // Two renewal periods after the restart: `a` still holds, `b` still waits.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(ga.is_current(), "a lost its lease over the restart");
    assert!(!waiter.is_finished(), "b got a held lease");
    let fa = ga.fence();
    let released = Instant::now();
    ga.release().await.unwrap();
    let gb = waiter.await.unwrap().unwrap();
    let took = released.elapsed();
    assert!(gb.fence() > fa);
    assert!(
        took < Duration::from_millis(900),
        "b waited {took:?} after the release: not woken by its notification"
    );
    gb.release().await.unwrap();
}

/// A process holding many leases renews them in one statement per period, not one per lease:
/// 60 leases held through 10 renewal periods cost a few dozen transactions, not 600. (The
/// server's counters lag by up to a second: the acquisitions are let in first.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_of_many_leases_are_one_statement() {
    let server = shared_postgres();
    let url = server.fresh_db();
    let db = db_of(&url).to_owned();
    let locks = leasehold::Locks::from_arc(store(&url).await).with_local_layer(false);
    let guards = leasehold_testkit::take_many(&locks, "many", 60, Duration::from_millis(900)).await;
    let commits = || -> u64 {
        server
            .psql(
                &db,
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
            )
            .unwrap()
            .parse()
            .unwrap()
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = commits();
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let after = commits();
    assert!(guards.iter().all(|g| g.is_current()));
    // 60 leases renewed every 300 ms: 600 statements one by one.
    let n = after - before;
    eprintln!("{n} transactions in 3 s for 60 leases");
    assert!(
        n <= 100,
        "{n} transactions for 60 leases over 10 renewal periods"
    );
    for g in guards {
        g.release().await.unwrap();
    }
}

/// `?schema=` and `?table=` name the table (created on first use, in its own schema); a user who
/// may not create it is told the DDL to run, and can use it once it is there.
#[tokio::test]
async fn the_table_is_named_by_the_url_and_created_once() {
    let server = shared_postgres();
    let url = server.fresh_db();
    let db = db_of(&url).to_owned();
    let custom = format!("{url}?schema=locks&table=app_leases");
    let s = store(&custom).await;
    let k = Key::new("x").unwrap();
    let req = AcquireRequest::new(k.clone(), "a", Duration::from_secs(5));
    assert!(matches!(
        s.acquire(&req).await.unwrap(),
        AcquireOutcome::Granted(_)
    ));
    assert_eq!(
        server
            .psql(&db, "SELECT holder FROM locks.app_leases")
            .as_deref(),
        Some("a")
    );
    // Opening again creates nothing and sees the lease.
    let again = store(&custom).await;
    assert!(matches!(
        again.inspect(&k).await.unwrap(),
        Some(Inspection::Record(r)) if r.holder.as_deref() == Some("a")
    ));
    // A user without CREATE on the database.
    server
        .psql(
            &db,
            "CREATE ROLE reader LOGIN; REVOKE CREATE ON SCHEMA public FROM PUBLIC; \
             GRANT USAGE ON SCHEMA locks TO reader; \
             GRANT ALL ON locks.app_leases, locks.app_leases_fence, locks.app_leases_permits \
             TO reader",
        )
        .unwrap();
    let as_reader = url.replace("postgres@", "reader@");
    let err = leasehold::open_store(&format!("{as_reader}?table=other"))
        .await
        .unwrap_err();
    assert!(!err.is_retryable(), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("CREATE TABLE IF NOT EXISTS \"public\".\"other\""),
        "{text}"
    );
    let s = store(&format!("{as_reader}?schema=locks&table=app_leases")).await;
    assert!(matches!(
        s.acquire(&AcquireRequest::new(k.clone(), "r", Duration::from_secs(5)))
            .await
            .unwrap(),
        AcquireOutcome::Held(_)
    ));
}

/// Labels round-trip whatever their bytes; labels bigger than the table keeps are refused at
/// acquire with a typed error, and so is a holder with NUL.
#[tokio::test]
async fn labels_round_trip_and_oversize_is_refused() {
    let s = store(&shared_postgres().fresh_db()).await;
    let k = Key::new("labels").unwrap();
    let mut req = AcquireRequest::new(k.clone(), "a", Duration::from_secs(5));
    for (n, v) in [
        ("nul", "a\0b"),
        ("quote", "'\"\\"),
        ("emoji", "🔒"),
        ("sql", "'); DROP TABLE x;--"),
    ] {
        req.labels.insert(n.into(), v.into());
    }
    let AcquireOutcome::Granted(r) = s.acquire(&req).await.unwrap() else {
        panic!("free")
    };
    assert_eq!(r.labels, req.labels);
    let Some(Inspection::Record(seen)) = s.inspect(&k).await.unwrap() else {
        panic!("no record")
    };
    assert_eq!(seen.labels, req.labels);
    let mut big = AcquireRequest::new(Key::new("big").unwrap(), "a", Duration::from_secs(5));
    big.labels.insert("x".into(), "y".repeat(70 * 1024));
    assert!(matches!(
        s.acquire(&big).await,
        Err(Error::InvalidOption { name: "labels", .. })
    ));
    let nul = AcquireRequest::new(Key::new("nul").unwrap(), "a\0b", Duration::from_secs(5));
    assert!(matches!(
        s.acquire(&nul).await,
        Err(Error::InvalidOption { name: "holder", .. })
    ));
}

/// `?mode=advisory` (session advisory locks, freed when the holder's connection ends) is refused
/// with a typed error saying why: a session that ends says nothing of whether its holder acts.
#[tokio::test]
async fn the_advisory_mode_is_refused_with_its_reason() {
    let url = shared_postgres().fresh_db();
    let err = leasehold::open_store(&format!("{url}?mode=advisory"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err}");
    assert!(err.to_string().contains("two holders"), "{err}");
    store(&format!("{url}?mode=table")).await;
}

/// Makes every insert into the default table by holder `slow` stall for a second after `VALUES`
/// is evaluated and before the `ON CONFLICT` arbiter check and row lock: a deterministic stand-in
/// for a backend descheduled there (a loaded host, a fresh backend after a restart).
fn stall_slow_inserts(db: &str) {
    let made = shared_postgres().psql(
        db,
        "CREATE FUNCTION stall() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           IF NEW.holder = 'slow' THEN PERFORM pg_sleep(1); END IF; RETURN NEW; END $$; \
         CREATE TRIGGER stall BEFORE INSERT ON public.leasehold_leases \
           FOR EACH ROW EXECUTE FUNCTION stall();",
    );
    assert!(made.is_some(), "the trigger was made");
}

/// Key `k` with a free row (granted once and released), then `slow`'s inserts stalled.
async fn free_row_then_stall(s: &Arc<dyn LockStore>, db: &str) -> Key {
    let key = Key::new("k").unwrap();
    let first = AcquireRequest::new(key.clone(), "a", Duration::from_secs(5));
    assert!(matches!(
        s.acquire(&first).await.unwrap(),
        AcquireOutcome::Granted(_)
    ));
    s.release(&key, &first.token).await.unwrap();
    stall_slow_inserts(db);
    key
}

/// Waits until a statement of database `db` sleeps in the trigger.
async fn until_stalled(db: &str) {
    let t = Instant::now();
    while shared_postgres()
        .psql(
            db,
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' \
             AND datname = current_database()",
        )
        .as_deref()
        != Some("1")
    {
        assert!(t.elapsed() < Duration::from_secs(10), "never stalled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Once an acquire of database `db` sleeps in the trigger: `key` granted to `fast` (holder
/// "fast") and released; the grant's record.
async fn granted_and_released_meanwhile(
    fast: &Arc<dyn LockStore>,
    key: &Key,
    db: &str,
) -> leasehold::LeaseRecord {
    until_stalled(db).await;
    let meanwhile = AcquireRequest::new(key.clone(), "fast", Duration::from_secs(5));
    let AcquireOutcome::Granted(f) = fast.acquire(&meanwhile).await.unwrap() else {
        panic!("free")
    };
    fast.release(key, &meanwhile.token).await.unwrap();
    f
}

/// An acquire that stalls between evaluating its statement and locking the row is granted a
/// fence above every grant made meanwhile (one fence, and a block of them): the fence is taken
/// on the locked row, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_acquire_is_fenced_above_grants_made_meanwhile() {
    for fences in [1u64, 10] {
        let url = shared_postgres().fresh_db();
        let db = db_of(&url).to_owned();
        let (fast, slow) = (store(&url).await, store(&url).await);
        let key = free_row_then_stall(&fast, &db).await;
        let mut req = AcquireRequest::new(key.clone(), "slow", Duration::from_secs(5));
        req.fences = fences;
        let stalled = tokio::spawn(async move { slow.acquire(&req).await });
        let f = granted_and_released_meanwhile(&fast, &key, &db).await;
        let AcquireOutcome::Granted(s) = stalled.await.unwrap().unwrap() else {
            panic!("released before the stalled acquire locked the row")
        };
        assert!(
            s.fence > f.fence,
            "{fences} fence(s): the stalled acquire got fence {} after {} was granted and released",
            s.fence,
            f.fence
        );
    }
}

/// The same stall on a key whose row `cleanup` deletes meanwhile: the clean-up waits for the
/// acquire in flight, which cannot recreate the key with the fence it took before the deletion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_acquire_cannot_recreate_a_cleaned_key_with_an_old_fence() {
    let url = shared_postgres().fresh_db();
    let db = db_of(&url).to_owned();
    let (fast, slow) = (store(&url).await, store(&url).await);
    let other = AcquireRequest::new(Key::new("other").unwrap(), "a", Duration::from_secs(5));
    assert!(matches!(
        fast.acquire(&other).await.unwrap(),
        AcquireOutcome::Granted(_)
    ));
    stall_slow_inserts(&db);
    let key = Key::new("k").unwrap();
    let req = AcquireRequest::new(key.clone(), "slow", Duration::from_secs(5));
    let stalled = tokio::spawn(async move { slow.acquire(&req).await });
    let f = granted_and_released_meanwhile(&fast, &key, &db).await;
    let cleaner = {
        let fast = fast.clone();
        tokio::spawn(async move {
            fast.cleanup(Duration::ZERO, &leasehold::CleanupProgress::new())
                .await
        })
    };
    let AcquireOutcome::Granted(s) = stalled.await.unwrap().unwrap() else {
        panic!("the key was free")
    };
    cleaner.await.unwrap().unwrap();
    assert!(
        s.fence > f.fence,
        "the stalled acquire got fence {} after {} was granted, released and cleaned up",
        s.fence,
        f.fence
    );
    assert!(
        matches!(fast.inspect(&key).await.unwrap(), Some(Inspection::Record(r)) if r.fence == s.fence),
        "the stalled acquire's lease is the key's record"
    );
}

/// A grant made after a wait on the server runs its whole TTL from the grant on the server's
/// clock, not from the statement's start (which would make it shorter, or already over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_after_a_stall_runs_its_whole_ttl() {
    let url = shared_postgres().fresh_db();
    let db = db_of(&url).to_owned();
    let s = store(&url).await;
    let key = free_row_then_stall(&s, &db).await;
    let req = AcquireRequest::new(key.clone(), "slow", Duration::from_millis(1500));
    assert!(matches!(
        s.acquire(&req).await.unwrap(),
        AcquireOutcome::Granted(_)
    ));
    let left: f64 = shared_postgres()
        .psql(
            &db,
            "SELECT extract(epoch FROM expires - clock_timestamp()) * 1000 \
             FROM public.leasehold_leases WHERE key = 'k'",
        )
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        left > 1200.0,
        "a 1.5 s lease granted after a 1 s stall has {left:.0} ms left on the server"
    );
}

/// A holder whose connection to the server is cut keeps its lease: nobody else is granted it
/// while the holder's guard is current (its renewals connect again), whatever the mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holder_whose_session_drops_keeps_its_lease() {
    let url = shared_postgres().fresh_db();
    let db = db_of(&url).to_owned();
    let holder = leasehold::Locks::from_arc(store(&url).await).with_holder(HolderId::new("a"));
    let ttl = Duration::from_secs(2);
    let g = holder
        .lock("job")
        .unwrap()
        .ttl(ttl)
        .acquire()
        .await
        .unwrap();
    // Every session of the database ends (a restart, a cut connection, a pooler's reset).
    assert!(shared_postgres()
        .psql(
            &db,
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .is_some());
    let contender = store(&url).await;
    let key = Key::new("job").unwrap();
    let until = Instant::now() + ttl * 2;
    while Instant::now() < until {
        let req = AcquireRequest::new(key.clone(), "b", Duration::from_secs(2));
        let out = contender.acquire(&req).await.unwrap();
        assert!(
            !matches!(out, AcquireOutcome::Granted(_)) || !g.is_current(),
            "b was granted the lease while a's guard is current"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(g.is_current(), "a lost its lease over the dropped session");
    g.release().await.unwrap();
}

/// A table made before the `watched` column (the DDL of earlier versions) gets it, the permit
/// columns and the permit table when a store opens it, and its rows keep their fences; its keys
/// can be semaphores then.
#[tokio::test]
async fn a_table_of_an_earlier_version_is_brought_up_to_date() {
    let server = shared_postgres();
    let url = server.fresh_db();
    let db = db_of(&url).to_owned();
    server
        .psql(
            &db,
            "CREATE TABLE leasehold_leases (key TEXT COLLATE \"C\" PRIMARY KEY, holder TEXT, \
             token TEXT, fence BIGINT NOT NULL, acquired TIMESTAMPTZ NOT NULL, \
             renewed TIMESTAMPTZ NOT NULL, expires TIMESTAMPTZ NOT NULL, ttl_ms BIGINT NOT NULL, \
             waiter TEXT, waiter_token TEXT, waiter_expires TIMESTAMPTZ, waiter_ttl_ms BIGINT, \
             pid INTEGER, host TEXT, labels TEXT NOT NULL DEFAULT '{}'); \
             CREATE SEQUENCE leasehold_leases_fence START 40; \
             INSERT INTO leasehold_leases (key, fence, acquired, renewed, expires, ttl_ms) \
             VALUES ('old', 39, now(), now(), now(), 1000)",
        )
        .unwrap();
    let s = store(&url).await;
    assert_eq!(
        server
            .psql(
                &db,
                "SELECT count(*) FROM pg_attribute WHERE attname = 'watched' \
                 AND attrelid = 'leasehold_leases'::regclass"
            )
            .as_deref(),
        Some("1")
    );
    assert_eq!(
        server
            .psql(
                &db,
                "SELECT count(*) FROM pg_attribute WHERE attrelid = 'leasehold_leases'::regclass \
                 AND attname IN ('permit_kind', 'permit_count', 'waiter_write')"
            )
            .as_deref(),
        Some("3")
    );
    let k = Key::new("old").unwrap();
    let req = AcquireRequest::new(k.clone(), "a", Duration::from_secs(5));
    let fence = match s.acquire(&req).await.unwrap() {
        AcquireOutcome::Granted(r) => r.fence,
        other => panic!("{other:?}"),
    };
    assert!(fence >= 40, "{fence}");
    s.release(&k, &req.token).await.unwrap();
    let sem = permit(&k, "b", PermitRequest::Semaphore { permits: 2 });
    match s.acquire(&sem).await.unwrap() {
        AcquireOutcome::Granted(r) => assert!(r.fence > fence, "{} after {fence}", r.fence),
        other => panic!("{other:?}"),
    }
}

/// A request for a permit of `want` on `key` by `holder`, for 30 s.
fn permit(key: &Key, holder: &str, want: PermitRequest) -> AcquireRequest {
    let mut req = AcquireRequest::new(key.clone(), holder, Duration::from_secs(30));
    req.permit = Some(want);
    req
}

/// A permit acquisition judges the key on its statement's snapshot and writes only if the
/// key's row is still the version it read: here the snapshot sees the only permit of a
/// semaphore of one expired, while its renewal (written as the store writes one: the key's row,
/// then the permit's) waits to commit. The acquisition waits for the renewal's row lock, finds
/// the row changed, and is judged again: held, never a second holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_judged_on_a_stale_snapshot_is_judged_again() {
    let url = shared_postgres().fresh_db();
    let db = db_of(&url).to_owned();
    let s = store(&url).await;
    let key = Key::new("sem").unwrap();
    let one = PermitRequest::Semaphore { permits: 1 };
    let a = permit(&key, "a", one);
    assert!(matches!(
        s.acquire(&a).await.unwrap(),
        AcquireOutcome::Granted(_)
    ));
    let expired = shared_postgres().psql(
        &db,
        "UPDATE leasehold_leases_permits SET expires = now() - interval '1 second'",
    );
    assert!(expired.is_some());
    let stalled_db = db.clone();
    let renewal = tokio::task::spawn_blocking(move || {
        shared_postgres().psql(
            &stalled_db,
            "BEGIN; UPDATE leasehold_leases SET renewed = now() WHERE key = 'sem'; \
             UPDATE leasehold_leases_permits SET expires = now() + interval '60 seconds' \
             WHERE key = 'sem'; SELECT pg_sleep(1); COMMIT;",
        )
    });
    until_stalled(&db).await;
    let out = s.acquire(&permit(&key, "b", one)).await.unwrap();
    assert!(
        matches!(out, AcquireOutcome::Held(_)),
        "b was granted the permit a renewed meanwhile: {out:?}"
    );
    assert!(renewal.await.unwrap().is_some(), "the renewal committed");
    let Some(Inspection::Record(r)) = s.inspect(&key).await.unwrap() else {
        panic!("no record")
    };
    let holders: Vec<_> = r
        .permits
        .unwrap()
        .holders
        .into_iter()
        .map(|p| p.holder)
        .collect();
    assert_eq!(holders, ["a"]);
}

/// Renewals of locks and permits asked for together go in one statement, and each is answered
/// as its own: a lock's record, or the permit's holder's view (its permit in the lock fields,
/// the key's holders beside it). A released permit is lost as released, a lapsed one as expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_and_permits_renew_together() {
    let url = shared_postgres().fresh_db();
    let db = db_of(&url).to_owned();
    let s = store(&url).await;
    let ttl = Duration::from_secs(30);
    let (sem, rw) = (Key::new("sem").unwrap(), Key::new("rw").unwrap());
    let two = PermitRequest::Semaphore { permits: 2 };
    let reqs = [
        AcquireRequest::new(Key::new("lock/1").unwrap(), "l1", ttl),
        AcquireRequest::new(Key::new("lock/2").unwrap(), "l2", ttl),
        permit(&sem, "p1", two),
        permit(&sem, "p2", two),
        permit(&rw, "r1", PermitRequest::Read),
    ];
    let mut fences = vec![];
    for req in &reqs {
        match s.acquire(req).await.unwrap() {
            AcquireOutcome::Granted(r) => fences.push(r.fence),
            other => panic!("{other:?}"),
        }
    }
    let renewals = reqs.iter().map(|r| s.renew(&r.key, &r.token, ttl));
    let outcomes = futures_util::future::join_all(renewals).await;
    for ((req, fence), out) in reqs.iter().zip(&fences).zip(outcomes) {
        let RenewOutcome::Renewed(r) = out.unwrap() else {
            panic!("{} not renewed", req.holder)
        };
        assert_eq!(r.token.as_deref(), Some(req.token.as_str()));
        assert_eq!(r.holder.as_deref(), Some(req.holder.as_str()));
        assert_eq!(r.fence, *fence, "{}'s own fence", req.holder);
        let held = r.permits.map(|t| t.holders.len());
        let expected = match req.key.as_str() {
            "sem" => Some(2),
            "rw" => Some(1),
            _ => None,
        };
        assert_eq!(held, expected, "{}", req.holder);
    }
    let (p1, p2) = (&reqs[2], &reqs[3]);
    assert_eq!(
        s.release(&sem, &p1.token).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        s.renew(&sem, &p1.token, ttl).await.unwrap(),
        RenewOutcome::Lost(LostReason::Released)
    );
    let lapsed = shared_postgres().psql(
        &db,
        "UPDATE leasehold_leases_permits SET expires = now() WHERE holder = 'p2'",
    );
    assert!(lapsed.is_some());
    assert_eq!(
        s.renew(&sem, &p2.token, ttl).await.unwrap(),
        RenewOutcome::Lost(LostReason::Expired)
    );
    assert_eq!(
        s.release(&sem, &p2.token).await.unwrap(),
        ReleaseOutcome::NotHeld
    );
}

/// The next notification `heard`.
async fn next(heard: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(Duration::from_secs(10), heard.recv())
        .await
        .expect("a notification")
        .expect("the listener")
}

/// A release notifies only when someone waits for it: a registered waiter, or a watching
/// contender whose attempt marked the row; an uncontended release sends nothing (the
/// notifications of one listener arrive in commit order, so the first heard is the first
/// release waited for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_release_someone_waits_for_notifies() {
    let url = shared_postgres().fresh_db();
    let s = store(&url).await;
    let (client, mut conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let (tx, mut heard) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(m)) = std::future::poll_fn(|cx| conn.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let _ = tx.send(n.payload().to_owned());
            }
        }
    });
    client
        .batch_execute("LISTEN \"public.leasehold_leases\"")
        .await
        .unwrap();
    let ttl = Duration::from_secs(30);
    let take = |key: &str| AcquireRequest::new(Key::new(key).unwrap(), "h", ttl);
    let granted = |o: AcquireOutcome| assert!(matches!(o, AcquireOutcome::Granted(_)), "{o:?}");
    let held = |o: AcquireOutcome| assert!(matches!(o, AcquireOutcome::Held(_)), "{o:?}");
    // Nobody waits: no notification.
    let alone = take("alone");
    granted(s.acquire(&alone).await.unwrap());
    s.release(&alone.key, &alone.token).await.unwrap();
    // A contender that watches (subscribed, not registered) marks the row.
    let watched = take("watched");
    granted(s.acquire(&watched).await.unwrap());
    let mut watcher = take("watched");
    watcher.watching = true;
    held(s.acquire(&watcher).await.unwrap());
    // A registered waiter.
    let waited = take("waited");
    granted(s.acquire(&waited).await.unwrap());
    let mut waiter = take("waited");
    waiter.waiter_ttl = Some(ttl);
    held(s.acquire(&waiter).await.unwrap());
    // Released again after a release that notified: nobody waits any more.
    let again = take("watched");
    s.release(&watched.key, &watched.token).await.unwrap();
    granted(s.acquire(&again).await.unwrap());
    s.release(&again.key, &again.token).await.unwrap();
    s.release(&waited.key, &waited.token).await.unwrap();
    assert_eq!(next(&mut heard).await, "watched");
    assert_eq!(next(&mut heard).await, "waited");
    // The waiter is granted the key reserved for it; its release notifies nobody, and an
    // observer's mark (`notify_release`) makes the next one notify.
    granted(s.acquire(&waiter).await.unwrap());
    s.release(&waiter.key, &waiter.token).await.unwrap();
    let observed = take("observed");
    granted(s.acquire(&observed).await.unwrap());
    assert!(s.notify_release(&observed.key, None).await.unwrap());
    s.release(&observed.key, &observed.token).await.unwrap();
    assert_eq!(next(&mut heard).await, "observed");
}

/// A permit release notifies as a lock release does, only when someone waits: a registered
/// waiter (a writer, here) or a watching contender; an uncontended release sends nothing, and
/// neither does a grant. An operator's release of one holder notifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_permit_release_someone_waits_for_notifies() {
    let url = shared_postgres().fresh_db();
    let s = store(&url).await;
    let (client, mut conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let (tx, mut heard) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(m)) = std::future::poll_fn(|cx| conn.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let _ = tx.send(n.payload().to_owned());
            }
        }
    });
    client
        .batch_execute("LISTEN \"public.leasehold_leases\"")
        .await
        .unwrap();
    let granted = |o: AcquireOutcome| assert!(matches!(o, AcquireOutcome::Granted(_)), "{o:?}");
    let held = |o: AcquireOutcome| assert!(matches!(o, AcquireOutcome::Held(_)), "{o:?}");
    let one = PermitRequest::Semaphore { permits: 1 };
    let (alone, watched, waited, forced) = (
        Key::new("alone").unwrap(),
        Key::new("watched").unwrap(),
        Key::new("waited").unwrap(),
        Key::new("forced").unwrap(),
    );
    // Nobody waits: no notification.
    let a = permit(&alone, "a", one);
    granted(s.acquire(&a).await.unwrap());
    s.release(&alone, &a.token).await.unwrap();
    // A watching contender marks the key.
    let w = permit(&watched, "a", one);
    granted(s.acquire(&w).await.unwrap());
    let mut watcher = permit(&watched, "b", one);
    watcher.watching = true;
    held(s.acquire(&watcher).await.unwrap());
    // A writer registered as waiter behind a reader.
    let reader = permit(&waited, "r", PermitRequest::Read);
    granted(s.acquire(&reader).await.unwrap());
    let mut writer = permit(&waited, "w", PermitRequest::Write);
    writer.waiter_ttl = Some(Duration::from_secs(30));
    let AcquireOutcome::Held(seen) = s.acquire(&writer).await.unwrap() else {
        panic!("a reader holds it")
    };
    assert_eq!(seen.waiter_token.as_deref(), Some(writer.token.as_str()));
    assert_eq!(
        seen.permits.map(|t| t.writers_waiting),
        Some(vec![writer.token.clone()])
    );
    s.release(&watched, &w.token).await.unwrap();
    s.release(&waited, &reader.token).await.unwrap();
    assert_eq!(next(&mut heard).await, "watched");
    assert_eq!(next(&mut heard).await, "waited");
    // The writer is granted; its release notifies nobody. An operator's release does.
    granted(s.acquire(&writer).await.unwrap());
    s.release(&waited, &writer.token).await.unwrap();
    let f = permit(&forced, "f", one);
    granted(s.acquire(&f).await.unwrap());
    assert!(s
        .force_release_holder(&forced, "f")
        .await
        .unwrap()
        .is_some());
    assert_eq!(next(&mut heard).await, "forced");
}

/// `cleanup` keeps a permit key while a permit is live; `force_release` frees every holder and
/// answers the record as it was; then `cleanup` removes the key with its permit rows, and the
/// next grant is still fenced above every earlier one.
#[tokio::test]
async fn permit_keys_are_cleaned_up_only_when_free() {
    let url = shared_postgres().fresh_db();
    let db = db_of(&url).to_owned();
    let s = store(&url).await;
    let key = Key::new("slots").unwrap();
    let two = PermitRequest::Semaphore { permits: 2 };
    let mut fences = vec![];
    for who in ["a", "b"] {
        match s.acquire(&permit(&key, who, two)).await.unwrap() {
            AcquireOutcome::Granted(r) => fences.push(r.fence),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        s.cleanup(Duration::ZERO, &leasehold::CleanupProgress::new())
            .await
            .unwrap()
            .removed,
        0
    );
    let was = s.force_release(&key).await.unwrap().expect("held");
    let holders: Vec<_> = was
        .permits
        .unwrap()
        .holders
        .into_iter()
        .map(|p| p.holder)
        .collect();
    assert_eq!(holders, ["a", "b"]);
    let Some(Inspection::Record(now)) = s.inspect(&key).await.unwrap() else {
        panic!("the key's row stays until cleanup")
    };
    assert_eq!(now.permits.map(|t| t.holders.len()), Some(0));
    assert_eq!(
        s.cleanup(Duration::ZERO, &leasehold::CleanupProgress::new())
            .await
            .unwrap()
            .removed,
        1
    );
    assert!(s.inspect(&key).await.unwrap().is_none());
    assert_eq!(
        shared_postgres()
            .psql(&db, "SELECT count(*) FROM leasehold_leases_permits")
            .as_deref(),
        Some("0")
    );
    match s
        .acquire(&permit(&key, "c", PermitRequest::Write))
        .await
        .unwrap()
    {
        AcquireOutcome::Granted(r) => assert!(r.fence > fences[1], "{} after {fences:?}", r.fence),
        other => panic!("{other:?}"),
    }
}

/// Who is inside a section guarded by permits, checked at each entry.
#[derive(Default)]
struct Inside {
    readers: u32,
    writers: u32,
}

/// Workers each on a store of its own (a connection each, as separate processes have) race for
/// permits of one key (`want(worker, round)`), so their statements run in concurrent
/// transactions: at most `limit` shared holders, a writer alone, and fences rising across the
/// whole run per worker.
async fn race_on_connections(
    url: &str,
    workers: usize,
    rounds: usize,
    limit: u32,
    want: fn(usize, usize) -> PermitRequest,
) {
    let inside = Arc::new(std::sync::Mutex::new(Inside::default()));
    let mut tasks = vec![];
    for w in 0..workers {
        let locks = leasehold::Locks::from_arc(store(url).await)
            .with_holder(HolderId::new(format!("worker-{w}")))
            .with_local_layer(false);
        let inside = inside.clone();
        tasks.push(tokio::spawn(async move {
            let mut last = 0;
            for round in 0..rounds {
                let p = want(w, round);
                let builder = match p {
                    PermitRequest::Semaphore { permits } => locks.semaphore("race", permits),
                    PermitRequest::Read => locks.read_write("race").map(|rw| rw.read()),
                    PermitRequest::Write => locks.read_write("race").map(|rw| rw.write()),
                };
                let g = builder
                    .unwrap()
                    .ttl(Duration::from_secs(5))
                    .wait(Duration::from_secs(60))
                    .acquire()
                    .await
                    .unwrap_or_else(|e| panic!("worker-{w} {p:?}: {e}"));
                assert!(
                    g.fence() > last,
                    "worker-{w}: fence {} after {last}",
                    g.fence()
                );
                last = g.fence();
                {
                    let mut i = inside.lock().unwrap();
                    if p.write() {
                        assert_eq!((i.readers, i.writers), (0, 0), "a writer beside others");
                        i.writers += 1;
                    } else {
                        assert_eq!(i.writers, 0, "a reader beside a writer");
                        i.readers += 1;
                        assert!(i.readers <= limit, "{} holders, at most {limit}", i.readers);
                    }
                }
                tokio::time::sleep(Duration::from_millis(fastrand::u64(1..4))).await;
                {
                    let mut i = inside.lock().unwrap();
                    match p.write() {
                        true => i.writers -= 1,
                        false => i.readers -= 1,
                    }
                }
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// A semaphore of two, then a read-write lock, raced for over six connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn permits_hold_across_concurrent_connections() {
    let url = shared_postgres().fresh_db();
    race_on_connections(&url, 6, 12, 2, |_, _| PermitRequest::Semaphore {
        permits: 2,
    })
    .await;
    let url = shared_postgres().fresh_db();
    race_on_connections(&url, 6, 12, leasehold::PERMIT_LIMIT, |w, round| {
        if (w + round) % 3 == 0 {
            PermitRequest::Write
        } else {
            PermitRequest::Read
        }
    })
    .await;
}

/// `force_release_holder` on a lock key frees the lease when named by its holder's id or its
/// token, and nothing for anyone else; the holder's next renewal is refused.
#[tokio::test]
async fn one_lock_holder_is_force_released_by_id_or_token() {
    let s = store(&shared_postgres().fresh_db()).await;
    let ttl = Duration::from_secs(30);
    for by_token in [false, true] {
        let key = Key::new(format!("lock/{by_token}")).unwrap();
        let a = AcquireRequest::new(key.clone(), "a", ttl);
        assert!(matches!(
            s.acquire(&a).await.unwrap(),
            AcquireOutcome::Granted(_)
        ));
        assert!(s.force_release_holder(&key, "b").await.unwrap().is_none());
        let who = if by_token { a.token.as_str() } else { "a" };
        let was = s.force_release_holder(&key, who).await.unwrap();
        assert_eq!(was.and_then(|r| r.holder).as_deref(), Some("a"));
        assert!(s.force_release_holder(&key, who).await.unwrap().is_none());
        assert_eq!(
            s.renew(&key, &a.token, ttl).await.unwrap(),
            RenewOutcome::Lost(LostReason::Released)
        );
    }
}

/// `cleanup` of 200 stale rows (one statement) reports its progress once, at its report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_progress_of_200_stale_rows_ends_at_the_report() {
    let url = shared_postgres().fresh_db();
    leasehold_testkit::cleanup_progress_ends_at_the_report(&url, 200).await;
}
