//! The etcd store (`etcd://[user:pass@]host1:2379,host2:2379,host3:2379[?prefix=…&ca=…]`):
//! leases as etcd keys attached to session leases, over a cluster's Raft consensus. TLS with
//! `?tls=true`, `?ca=` and client certificates (`?cert=&key=`); see [`EtcdOptions`].
//!
//! Checklist — native TTL: yes (each key is attached to an etcd lease, and deleted by its holder
//! process when its own TTL passes unrenewed); watch: yes (an etcd watch on the key, its waiter
//! and its permits: waiters wake on the holder's release, no polling); permits: yes (see
//! [below](#semaphores-and-read-write-locks)); liveness: no (a killed holder's keys go when its
//! session lease expires, at most ⌈1.5 × TTL⌉ + 1 s later, 2 s at least); fence: the record key's
//! **create revision**, etcd's cluster-wide revision counter, which every later write of the
//! cluster exceeds: `fence = create revision × 65536 + (block − 1)`, where a block of `n` fences
//! ([`AcquireRequest::fences`]) is `fence − n + 1 ..= fence` (a plain acquisition reserves one,
//! so its fence is `create revision × 65536`). No clock is involved, and neither a deletion nor
//! a leader change can make a fence go backwards.
//!
//! # Sessions
//! Each store keeps one etcd lease per lease-time class (the TTL rounded up to whole seconds)
//! — one for all the keys a process holds with the same TTL — kept alive by one
//! keep-alive stream: renewing 10,000 leases costs that stream, not 10,000 keep-alives. A
//! renewal reads the key (to see a force release, a takeover or a waiter) and says "renewed"
//! only while the session is surely alive for the whole TTL asked for, counted on this process's
//! monotonic clock from the last keep-alive etcd answered; a session lost (its keep-alives
//! failing past its TTL, revoked, the member partitioned away from the leader) makes every
//! guard of it see `lost()` before etcd could free its keys for another process.
//!
//! # Records
//! The lease record (JSON, as every store's) lives at `<prefix>lock/<key>` (default prefix
//! `leasehold/`), created by a transaction that succeeds only if the key's create revision is 0
//! (it does not exist) and no other waiter reserved it; a release deletes it. A waiter
//! registers at `<prefix>waiter/<key>` (attached to its own session), which reserves the key
//! for it once freed, and which the holder's renewals read (`handoff_requested()`).
//! `etcdctl get --prefix leasehold/lock/` lists them; `etcdctl del leasehold/lock/KEY` is a
//! force release. A record must fit in one etcd request ([`options::MAX_REQUEST_BYTES`], 1.5 MiB
//! by default): larger labels are refused at acquire.
//!
//! # Semaphores and read-write locks
//! A permit ([`AcquireRequest::permit`]) is a key of its own, `<prefix>permit/<key>\0<slot>`,
//! attached to its session like a lease record and renewed, deleted at its deadline and freed
//! with its session the same way; its fence is its create revision × 65536. A grant creates one
//! slot key (`0 ..= n−1` of a semaphore of `n`, `0 ..= 63` for readers, `w` for a writer)
//! compared absent in its transaction, so the count holds under any race; `<prefix>kind/<key>`
//! (`semaphore:N` or `read-write`) is compared by every grant, and a lock's grant compares the
//! permit prefix empty, so a key is one kind at a time. A waiting writer registers as the key's
//! waiter, and a reader's grant compares the waiter key as it read it, so no reader slips past a
//! writer registering meanwhile (the rules: `permits.rs`). `etcdctl get --prefix
//! leasehold/permit/` lists the permits; `cleanup` deletes the kind keys no permit uses. An uncontended grant on a key of its kind is one transaction (two on a key's
//! first use or a change of kind), a renewal one read, a release one transaction.
//!
//! # Rules
//! Each transaction keeps one step of the rules every store shares (`crate::decide`), with one
//! registered waiter for the line and no place in it, named here by its step. The acquisitions
//! are read → plan (a pure function of what was read) → one transaction → answer.
//!
//! | server-side rule | mirrors |
//! | --- | --- |
//! | `lock.rs`: `plan`, then `grant_txn` (the record created, compared absent; the waiter registered when held) | acquire → `decide::Rules::acquire` |
//! | `permits.rs`: `plan`, then `grant_txn` (a slot key created, compared absent) | acquire of a permit → `decide::Rules::acquire` (`decide/permits.rs`) |
//! | a renewal: one read, the session vouching (`keep_session`) | renew → `decide::Rules::renew` |
//! | a release: the key deleted, compared at its create revision | release → `decide::Rules::release` |
//! | a waiter's withdrawal: its key deleted, compared | the line's `leave_line` |
//! | a force release: the keys deleted, each compared as read | freed → `decide::Rules::freed` |
//! | the session lease's expiry; `cleanup` of unused kind keys | removable → `decide::Rules::removable` |
//!
//! # Module map
//! | file | holds | uses |
//! | --- | --- | --- |
//! | `mod.rs` | [`EtcdStore`], the [`LockStore`] impl: renewal, release, inspection | all below |
//! | `lock.rs` | the lock path: its plan and its grant's transaction | read, permits, held, session, `decide` (mismatch) |
//! | `permits.rs` | semaphores and read-write locks: the permit keys, their plan and the grant's transaction | read, held, session, `decide` (views, mismatch) |
//! | `read.rs` | one read of a key's etcd keys, as owned values the plans take | — |
//! | `watch.rs` | the change notification of a key | error |
//! | `held.rs` | the keys held, each deleted at its own deadline; writes without answer | session, error |
//! | `session.rs` | session leases and their keep-alive | error |
//! | `options.rs` | [`EtcdOptions`] and the URL | — |
//! | `error.rs` | etcd errors as [`Error`]s | — |

mod error;
mod floor;
mod held;
mod lock;
mod options;
mod permits;
mod read;
mod session;
mod watch;

pub use options::{EtcdOptions, LABEL_LIMIT, MAX_REQUEST_BYTES};

use self::error::{bounded, retried};
use self::held::Held;
use self::read::Kv;
use self::session::{Sessions, Vouch};
use crate::error::{Error, Result};
use crate::key::Key;
use crate::record::{now_ms, LeaseRecord};
use crate::store::{
    AcquireOutcome, AcquireRequest, Capabilities, ChangeWatch, CleanupProgress, CleanupReport,
    Inspection, LockStore, LostReason, ReleaseOutcome, RenewOutcome,
};
use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnResponse};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Fences per create revision: a block reserved by one grant stays below this.
pub const FENCE_STRIDE: u64 = 1 << 16;

/// The `store` entry of a written record holding its block size (its fence is computed from the
/// create revision when read).
const FENCES: &str = "fences";

/// The `store` entry of a written record that makes its value name one write
/// ([`held::next_write`]).
const WRITE: &str = "write";

/// The etcd store; see the [module docs](self).
#[derive(Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
}

struct Inner {
    client: etcd_client::Client,
    described: String,
    timeout: Duration,
    locks: String,
    waiters: String,
    /// The root of the permit keys (`<prefix>permit/`).
    permits: String,
    /// The root of the kind keys (`<prefix>kind/`).
    kinds: String,
    sessions: Sessions,
    held: Arc<Held>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("store", &self.inner.described)
            .field("prefix", &self.inner.locks)
            .finish_non_exhaustive()
    }
}

/// A held key to keep on a session that vouches for its renewal ([`EtcdStore::keep_session`]).
struct Keep<'a> {
    /// The key, for the log.
    key: &'a Key,
    /// The etcd key held.
    name: &'a str,
    /// The owner token that holds it.
    token: &'a str,
    /// Its entry in [`Held`].
    entry: &'a held::Entry,
    /// Its value, written again when it moves to a longer session.
    value: &'a [u8],
    /// The renewal's TTL.
    ttl: Duration,
    /// Renewed for longer than its session may vouch for.
    longer: bool,
    /// What it is, for the log: a lease or a permit.
    what: &'static str,
}

/// A waiter registration as stored.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Waiter {
    waiter: String,
    waiter_token: String,
    waiter_ttl_ms: u64,
    /// Makes the value name one write ([`held::next_write`]).
    #[serde(default)]
    write: u64,
    /// What it waits for when it waits for a permit ([`permits::waiter_kind`]); `None`: a lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    permit: Option<String>,
}

impl EtcdStore {
    /// Connects to the members in `opts` and checks that one answers.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for unreadable TLS files; [`Error::Unavailable`] when no member
    /// answers; a non-retryable [`Error::Store`] saying "authentication failed" when the user
    /// or password is refused.
    ///
    /// ```no_run
    /// # async fn f() -> leasehold::Result<()> {
    /// use leasehold::stores::etcd::{EtcdOptions, EtcdStore};
    /// let mut opts = EtcdOptions::default();
    /// opts.endpoints = vec!["http://10.0.0.1:2379".into(), "http://10.0.0.2:2379".into()];
    /// opts.prefix = "jobs/".into();
    /// // The same as EtcdOptions::from_url("etcd://10.0.0.1:2379,10.0.0.2:2379?prefix=jobs/")?
    /// let locks = leasehold::Locks::new(EtcdStore::connect(opts).await?);
    /// let guard = locks.lock("nightly-report")?.acquire().await?;
    /// println!("fence {}", guard.fence()); // pass it to whatever the lock protects
    /// # Ok(()) }
    /// ```
    pub async fn connect(opts: EtcdOptions) -> Result<Self> {
        let described = options::describe(&opts);
        let mut connect = etcd_client::ConnectOptions::new()
            .with_timeout(opts.timeout)
            .with_connect_timeout(opts.timeout)
            .with_require_leader(true)
            .with_keep_alive(opts.timeout, opts.timeout);
        if let Some((user, pass)) = &opts.user {
            connect = connect.with_user(user.clone(), pass.clone());
        }
        if opts.tls {
            connect = connect.with_tls(tls_options(&opts)?);
        }
        let client = bounded(
            &described,
            opts.timeout * 2,
            etcd_client::Client::connect(opts.endpoints.clone(), Some(connect)),
        )
        .await?;
        let store = EtcdStore {
            inner: Arc::new(Inner {
                sessions: Sessions::new(client.clone(), described.clone(), opts.timeout),
                held: Arc::new(Held::new(
                    client.clone(),
                    described.clone(),
                    opts.timeout,
                    format!("{}permit/", opts.prefix),
                )),
                client,
                timeout: opts.timeout,
                locks: format!("{}lock/", opts.prefix),
                waiters: format!("{}waiter/", opts.prefix),
                permits: format!("{}permit/", opts.prefix),
                kinds: format!("{}kind/", opts.prefix),
                described,
            }),
        };
        // One read, so that an unreachable cluster or refused credentials show now.
        let probe = store.inner.locks.clone();
        store
            .call(|mut c| {
                let probe = probe.clone();
                async move {
                    c.get(probe, Some(GetOptions::new().with_count_only()))
                        .await
                }
            })
            .await?;
        Ok(store)
    }

    /// One call with the store's client, bounded by its timeout.
    /// (Sent again when it never reached a member, see [`retried`].)
    async fn call<T, F>(&self, mut f: impl FnMut(etcd_client::Client) -> F) -> Result<T>
    where
        F: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let i = &self.inner;
        retried(&i.described, i.timeout, || f(i.client.clone())).await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        self.call(|mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    fn lock_name(&self, key: &Key) -> String {
        format!("{}{}", self.inner.locks, key.as_str())
    }

    fn waiter_name(&self, key: &Key) -> String {
        format!("{}{}", self.inner.waiters, key.as_str())
    }

    /// The lease record in `kv` (of `key`): [`lock_record`].
    fn record(&self, key: &str, kv: &Kv) -> Result<LeaseRecord> {
        lock_record(key, kv)
    }

    /// `r` with the waiter registration in `w`, if any (live for its lifetime from now: it
    /// exists, so its holder keeps it).
    fn with_waiter(r: &mut LeaseRecord, w: Option<&Waiter>) {
        if let Some(w) = w {
            r.waiter = Some(w.waiter.clone());
            r.waiter_token = Some(w.waiter_token.clone());
            r.waiter_expires_ms = Some(now_ms() + w.waiter_ttl_ms);
            r.waiter_ttl_ms = Some(w.waiter_ttl_ms);
        }
    }

    /// The record to write for `req` (its fence comes from the create revision).
    fn grant_record(&self, req: &AcquireRequest) -> Result<(LeaseRecord, Vec<u8>)> {
        req.check_size(options::LABEL_LIMIT, &self.describe())?;
        let mut rec = LeaseRecord::free(req.key.as_str(), 0);
        crate::decide::grant(&mut rec, req, 0, now_ms());
        rec.store
            .insert(FENCES.into(), req.fences.max(1).to_string());
        rec.store
            .insert(WRITE.into(), held::next_write().to_string());
        let value = serde_json::to_vec(&rec).map_err(|e| Error::InvalidOption {
            name: "labels",
            reason: format!("cannot be written as JSON: {e}"),
        })?;
        let size = value.len() + self.lock_name(&req.key).len();
        if size + 1024 > options::MAX_REQUEST_BYTES {
            return Err(Error::InvalidOption {
                name: "labels",
                reason: format!(
                    "the lease record would be {size} bytes; etcd refuses requests over {} bytes (1.5 MiB, its --max-request-bytes default)",
                    options::MAX_REQUEST_BYTES
                ),
            });
        }
        Ok((rec, value))
    }

    /// Registers `req` as waiter of a key (waiting as `permit`, `None` for a lock) while `when`
    /// holds, unless someone registered first; whether it did.
    async fn register(
        &self,
        req: &AcquireRequest,
        wttl: Duration,
        mut when: Vec<Compare>,
        permit: Option<String>,
    ) -> Result<bool> {
        let w = self.waiter_name(&req.key);
        let session = self.inner.sessions.for_ttl(wttl).await?;
        let value = serde_json::to_vec(&Waiter {
            waiter: req.holder.clone(),
            waiter_token: req.token.clone(),
            waiter_ttl_ms: crate::record::ms(wttl),
            write: held::next_write(),
            permit,
        })
        .unwrap_or_default();
        when.push(Compare::create_revision(w.clone(), CompareOp::Equal, 0));
        let sent = Instant::now();
        let answer = self
            .txn(Txn::new().when(when).and_then([TxnOp::put(
                w.clone(),
                value.clone(),
                Some(PutOptions::new().with_lease(session.id)),
            )]))
            .await;
        let r = match answer {
            Ok(r) => r,
            Err(e) => {
                let at = sent + wttl;
                self.inner
                    .held
                    .unanswered(&w, &req.token, value, at, session);
                return Err(e);
            }
        };
        if r.succeeded() {
            let rev = revision(&r);
            self.inner
                .held
                .insert(&w, &req.token, rev, session, sent + wttl);
        }
        Ok(r.succeeded())
    }
}

impl EtcdStore {
    /// The grant `lock` is when an earlier attempt of `req` (same owner token) created it on
    /// `session` but its answer was lost, and its clean-up has not begun: recorded as held from
    /// now (and then never cleaned up). A write whose clean-up began is not a grant: the key
    /// shows as held (by us) until it is deleted.
    fn own_unanswered(
        &self,
        req: &AcquireRequest,
        lock: &Kv,
        session: &Arc<session::Session>,
    ) -> Option<LeaseRecord> {
        let rec = self.record(req.key.as_str(), lock).ok()?;
        if rec.token.as_deref() != Some(req.token.as_str()) || lock.lease() != session.id {
            return None;
        }
        if !matches!(session.vouch(Instant::now() + req.ttl), Vouch::Alive) {
            return None;
        }
        let l = self.lock_name(&req.key);
        let adopted = self.inner.held.adopt(
            &l,
            &req.token,
            lock.value(),
            lock.create_revision(),
            session.clone(),
            Instant::now() + req.ttl,
        );
        adopted.then_some(rec)
    }
}

/// The TLS settings of `opts`: its CA (else the system's trust store) and client certificate.
///
/// # Errors
/// [`Error::InvalidOption`] naming a file that cannot be read.
fn tls_options(opts: &EtcdOptions) -> Result<etcd_client::TlsOptions> {
    fn read(name: &'static str, path: &std::path::Path) -> Result<Vec<u8>> {
        std::fs::read(path).map_err(|e| Error::InvalidOption {
            name,
            reason: format!("cannot read {}: {e}", path.display()),
        })
    }
    let mut tls = etcd_client::TlsOptions::new();
    tls = match &opts.ca_file {
        Some(ca) => tls.ca_certificate(etcd_client::Certificate::from_pem(read("ca", ca)?)),
        None => tls.with_native_roots(),
    };
    if let Some((cert, key)) = &opts.client_cert {
        tls = tls.identity(etcd_client::Identity::from_pem(
            read("cert", cert)?,
            read("key", key)?,
        ));
    }
    Ok(tls)
}

/// The fence of a grant created at revision `rev` reserving `block` fences.
fn fence_of(rev: i64, block: u64) -> u64 {
    (rev.max(0) as u64)
        .saturating_mul(FENCE_STRIDE)
        .saturating_add(block.clamp(1, FENCE_STRIDE) - 1)
}

/// The revision a transaction's answer was written at.
fn revision(r: &TxnResponse) -> i64 {
    r.header().map_or(0, |h| h.revision())
}

/// The lease record in `kv` (of `key`), its fence from the create revision and its expiry at
/// least its TTL from now (a key that exists is held until its holder deletes it or its
/// session ends).
fn lock_record(key: &str, kv: &Kv) -> Result<LeaseRecord> {
    let mut r: LeaseRecord = serde_json::from_slice(kv.value()).map_err(|e| Error::Corrupt {
        key: key.to_owned(),
        detail: format!("not a leasehold record: {e}"),
    })?;
    let block = r
        .store
        .remove(FENCES)
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(1);
    r.fence = fence_of(kv.create_revision(), block);
    r.store.clear();
    r.expires_ms = r.expires_ms.max(now_ms() + r.ttl_ms);
    Ok(r)
}

/// The waiter registration in `kv`, if it is one.
fn parse_waiter(kv: Option<&Kv>) -> Option<Waiter> {
    kv.and_then(|kv| serde_json::from_slice(kv.value()).ok())
}

#[async_trait]
impl LockStore for EtcdStore {
    fn describe(&self) -> String {
        self.inner.described.clone()
    }

    fn floor(&self) -> Option<Arc<dyn crate::floor::Floor>> {
        Some(Arc::new(floor::EtcdFloor(self.clone())))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_ttl: true,
            watch: true,
            liveness: false,
            fence_source: "the record key's create revision (etcd's cluster-wide revision) × 65536",
            waiter_line: false,
            release_grants: false,
            permits: true,
            expiry_clock: crate::store::ExpiryClock::Server,
        }
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        if let Some(p) = req.permit {
            return self.acquire_permit(req, p).await;
        }
        self.acquire_lock(req).await
    }

    async fn renew(&self, key: &Key, token: &str, ttl: Duration) -> Result<RenewOutcome> {
        let n = self.names(key);
        if let Some((name, entry)) = self.inner.held.by_token(&n.prefix, token) {
            return self.renew_permit(key, &n, token, ttl, name, entry).await;
        }
        let l = self.lock_name(key);
        let sent = Instant::now();
        let entry = self.inner.held.get(&l, token);
        let (lock, waiter_kv) = match entry {
            Some(_) => self.read(key).await?,
            None => {
                let st = self.read_state(&n).await?;
                if st.lock.is_none() && Self::slot_of_token(&n, &st, token).is_some() {
                    // A permit of ours whose deadline passed here (its deletion is under way).
                    return Ok(RenewOutcome::Lost(LostReason::Expired));
                }
                (st.lock, st.waiter)
            }
        };
        let Some(lock) = lock else {
            self.inner.held.remove(&l, token);
            return Ok(RenewOutcome::Lost(LostReason::Released));
        };
        let mut rec = match self.record(key.as_str(), &lock) {
            Ok(r) => r,
            Err(_) => {
                self.inner.held.remove(&l, token);
                return Ok(RenewOutcome::Lost(LostReason::TakenOver {
                    holder: "unknown (a value that is not a leasehold record)".into(),
                }));
            }
        };
        if rec.token.as_deref() != Some(token) {
            self.inner.held.remove(&l, token);
            return Ok(RenewOutcome::Lost(LostReason::TakenOver {
                holder: rec.holder.unwrap_or_default(),
            }));
        }
        let Some(entry) = entry.filter(|e| e.create_rev == lock.create_revision()) else {
            // Ours, but its deadline passed here (its deletion is under way).
            return Ok(RenewOutcome::Lost(LostReason::Expired));
        };
        let longer =
            session::lease_secs(ttl) > session::lease_secs(Duration::from_millis(rec.ttl_ms));
        let session = match self
            .keep_session(Keep {
                key,
                name: &l,
                token,
                entry: &entry,
                value: lock.value(),
                ttl,
                longer,
                what: "lease",
            })
            .await?
        {
            Ok(session) => session,
            Err(lost) => return Ok(lost),
        };
        if !self.inner.held.extend(&l, token, sent + ttl, Some(session)) {
            return Ok(RenewOutcome::Lost(LostReason::Expired));
        }
        let now = now_ms();
        rec.renewed_ms = now;
        rec.ttl_ms = crate::record::ms(ttl);
        rec.expires_ms = now + rec.ttl_ms;
        Self::with_waiter(&mut rec, parse_waiter(waiter_kv.as_ref()).as_ref());
        Ok(RenewOutcome::Renewed(rec))
    }

    async fn release(&self, key: &Key, token: &str) -> Result<ReleaseOutcome> {
        let n = self.names(key);
        let held = match self.inner.held.by_token(&n.prefix, token) {
            Some((name, e)) => Some((name, e)),
            None => self
                .inner
                .held
                .get(&n.lock, token)
                .map(|e| (n.lock.clone(), e)),
        };
        if let Some((l, e)) = held {
            let deleted = match self.inner.held.delete_if(&l, e.create_rev).await {
                Ok(deleted) => deleted,
                Err(err) => {
                    // Deleted in the background, retried while its session lives.
                    self.inner.held.delete_soon(&l, token);
                    return Err(err);
                }
            };
            self.inner.held.remove(&l, token);
            return Ok(if deleted {
                ReleaseOutcome::Released
            } else {
                ReleaseOutcome::NotHeld
            });
        }
        // Not held here (expired, or never ours): a record or permit of ours still there is
        // cleared.
        let st = self.read_state(&n).await?;
        if let Some(kv) = st.lock.as_ref() {
            if let Ok(r) = self.record(key.as_str(), kv) {
                if r.token.as_deref() == Some(token) {
                    self.inner
                        .held
                        .delete_if(&n.lock, kv.create_revision())
                        .await?;
                }
            }
        }
        if let Some((name, rev)) = Self::slot_of_token(&n, &st, token) {
            self.inner.held.delete_if(&name, rev).await?;
        }
        Ok(ReleaseOutcome::NotHeld)
    }

    async fn withdraw_waiter(&self, key: &Key, token: &str) -> Result<()> {
        let w = self.waiter_name(key);
        if let Some(e) = self.inner.held.get(&w, token) {
            if let Err(err) = self.inner.held.delete_if(&w, e.create_rev).await {
                self.inner.held.delete_soon(&w, token);
                return Err(err);
            }
            self.inner.held.remove(&w, token);
            return Ok(());
        }
        let (_, waiter_kv) = self.read(key).await?;
        if let Some(kv) = waiter_kv {
            if parse_waiter(Some(&kv)).is_some_and(|wr| wr.waiter_token == token) {
                self.inner.held.delete_if(&w, kv.create_revision()).await?;
            }
        }
        Ok(())
    }

    async fn inspect(&self, key: &Key) -> Result<Option<Inspection>> {
        let n = self.names(key);
        let st = self.read_state(&n).await?;
        let waiter = parse_waiter(st.waiter.as_ref());
        let permit_waiter = waiter.as_ref().is_some_and(|w| w.permit.is_some());
        if st.lock.is_none() && (!st.slots.is_empty() || permit_waiter) {
            let r = permits::record_of(key.as_str(), &st, None);
            return Ok(Some(Inspection::Record(r)));
        }
        let lock = st.lock;
        let Some(lock) = lock else {
            return Ok(waiter.map(|w| {
                let mut free = LeaseRecord::free(key.as_str(), 0);
                Self::with_waiter(&mut free, Some(&w));
                Inspection::Record(free)
            }));
        };
        Ok(Some(match self.record(key.as_str(), &lock) {
            Ok(mut r) => {
                Self::with_waiter(&mut r, waiter.as_ref());
                Inspection::Record(r)
            }
            Err(e) => Inspection::Corrupt {
                name: self.lock_name(key),
                detail: e.to_string(),
            },
        }))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Inspection>> {
        let from = format!("{}{prefix}", self.inner.locks);
        let mut got = self
            .call(|mut c| {
                let from = from.clone();
                async move { c.get(from, Some(GetOptions::new().with_prefix())).await }
            })
            .await?;
        let locks = self.inner.locks.len();
        let permits = self.list_permits(prefix).await?;
        Ok(got
            .take_kvs()
            .into_iter()
            .map(|kv| {
                let kv = Kv::from(kv);
                let name = String::from_utf8_lossy(kv.key()).into_owned();
                let key = name.get(locks..).unwrap_or_default();
                match self.record(key, &kv) {
                    Ok(r) => Inspection::Record(r),
                    Err(e) => Inspection::Corrupt {
                        name: name.clone(),
                        detail: e.to_string(),
                    },
                }
            })
            .chain(permits.into_iter().map(Inspection::Record))
            .collect())
    }

    async fn force_release(&self, key: &Key) -> Result<Option<LeaseRecord>> {
        self.force_free(key, None).await
    }

    async fn force_release_holder(&self, key: &Key, holder: &str) -> Result<Option<LeaseRecord>> {
        self.force_free(key, Some(holder)).await
    }

    async fn cleanup(
        &self,
        _older_than: Duration,
        progress: &CleanupProgress,
    ) -> Result<CleanupReport> {
        // Released leases and permits are deleted at once and expired ones by their holder or
        // their session's end; fences need nothing kept (they come from revisions). What is left
        // are the kind keys of semaphores and read-write locks nobody holds.
        let (removed, kept) = self.cleanup_kinds().await?;
        progress.add_finished((removed + kept) as u64);
        Ok(CleanupReport { removed, kept })
    }

    async fn subscribe(&self, key: &Key) -> Result<Option<Box<dyn ChangeWatch>>> {
        let n = self.names(key);
        let i = &self.inner;
        let names = [
            (n.lock.as_str(), false),
            (n.waiter.as_str(), false),
            (n.prefix.as_str(), true),
        ];
        let watch = watch::KeyWatch::open(&i.client, &names, &i.described, i.timeout).await?;
        Ok(Some(Box::new(watch)))
    }
}

impl EtcdStore {
    /// Frees what `who` holds on `key` (everything when `None`): its permits, or its lease.
    async fn force_free(&self, key: &Key, who: Option<&str>) -> Result<Option<LeaseRecord>> {
        let n = self.names(key);
        let l = n.lock.clone();
        for _ in 0..4 {
            let st = self.read_state(&n).await?;
            if !st.slots.is_empty() {
                return self.force_free_permits(&n, key, &st, who).await;
            }
            let Some(kv) = st.lock else { return Ok(None) };
            if let Some(who) = who {
                let rec = self.record(key.as_str(), &kv).ok();
                let ours = rec.as_ref().is_some_and(|r| {
                    r.holder.as_deref() == Some(who) || r.token.as_deref() == Some(who)
                });
                if !ours {
                    return Ok(None);
                }
            }
            let r = self
                .txn(
                    Txn::new()
                        .when([Compare::mod_revision(
                            l.clone(),
                            CompareOp::Equal,
                            kv.mod_revision(),
                        )])
                        .and_then([TxnOp::delete(l.clone(), None)]),
                )
                .await?;
            if r.succeeded() {
                return Ok(self.record(key.as_str(), &kv).ok());
            }
        }
        Err(Error::Store {
            store: self.inner.described.clone(),
            detail: format!("the key {} changed under four force releases", key.as_str()),
            retryable: true,
            source: None,
        })
    }

    /// Keeps a held key on a session that vouches for its renewal ([`Keep`]): with
    /// `keep.longer`, first moved to a session of the renewal's TTL, then vouched for until that
    /// TTL from now. The session to extend it on, or the renewal's answer when it is lost; an
    /// error while the session's keep-alives are late.
    async fn keep_session(
        &self,
        keep: Keep<'_>,
    ) -> Result<std::result::Result<Arc<session::Session>, RenewOutcome>> {
        let Keep {
            key,
            name,
            token,
            entry,
            value,
            ttl,
            longer,
            what,
        } = keep;
        let mut session = entry.session.clone();
        if longer && session.ttl < Duration::from_secs(session::lease_secs(ttl) as u64) {
            // Renewed for longer than its session vouches for: move it to a longer one.
            let longer = self.inner.sessions.for_ttl(ttl).await?;
            let moved = self
                .txn(
                    Txn::new()
                        .when([Compare::create_revision(
                            name,
                            CompareOp::Equal,
                            entry.create_rev,
                        )])
                        .and_then([TxnOp::put(
                            name,
                            value.to_vec(),
                            Some(PutOptions::new().with_lease(longer.id)),
                        )]),
                )
                .await?;
            if !moved.succeeded() {
                self.inner.held.remove(name, token);
                return Ok(Err(RenewOutcome::Lost(LostReason::Released)));
            }
            session = longer;
        }
        match session.vouch(Instant::now() + ttl) {
            Vouch::Alive => Ok(Ok(session)),
            Vouch::Late(why) => Err(Error::unavailable(&self.inner.described, why)),
            Vouch::Dead(why) => {
                self.inner.held.remove(name, token);
                tracing::debug!(key = %key, reason = %why, "{what} lost with its session");
                Ok(Err(RenewOutcome::Lost(LostReason::Expired)))
            }
        }
    }

    /// Renews the permit `token` holds at `name` (`entry` in [`Held`]).
    async fn renew_permit(
        &self,
        key: &Key,
        n: &read::Names,
        token: &str,
        ttl: Duration,
        name: String,
        entry: held::Entry,
    ) -> Result<RenewOutcome> {
        let sent = Instant::now();
        let st = self.read_state(n).await?;
        let Some(kv) = st
            .slots
            .iter()
            .find(|kv| kv.key() == name.as_bytes() && kv.create_revision() == entry.create_rev)
        else {
            self.inner.held.remove(&name, token);
            return Ok(RenewOutcome::Lost(LostReason::Released));
        };
        let session = match self
            .keep_session(Keep {
                key,
                name: &name,
                token,
                entry: &entry,
                value: kv.value(),
                ttl,
                longer: true,
                what: "permit",
            })
            .await?
        {
            Ok(session) => session,
            Err(lost) => return Ok(lost),
        };
        if !self
            .inner
            .held
            .extend(&name, token, sent + ttl, Some(session))
        {
            return Ok(RenewOutcome::Lost(LostReason::Expired));
        }
        Ok(RenewOutcome::Renewed(Self::renewed(key, &st, token, ttl)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_come_in_blocks_above_each_revision() {
        assert_eq!(fence_of(7, 1), 7 * FENCE_STRIDE);
        assert_eq!(fence_of(7, 64), 7 * FENCE_STRIDE + 63);
        assert!(fence_of(8, 1) - 1 + 1 > fence_of(7, FENCE_STRIDE - 1));
    }
}
