//! Kubernetes Lease store: `k8s://[namespace][?prefix=…&server=…&timeout=…]` (or `kubernetes://`).
//!
//! Checklist:
//! - **records**: one `coordination.k8s.io/v1` Lease per key, named prefix + the key sanitised to
//!   DNS-1123 ([`Naming::dns1123`]; keys that do not fit get prefix + readable part + hash, so two
//!   keys never share a name), labelled `app.kubernetes.io/managed-by: leasehold`;
//! - **spec** as Kubernetes' own leader election sets it: `holderIdentity`, `leaseDurationSeconds`
//!   (the TTL rounded up to whole seconds), `acquireTime`, `renewTime`, `leaseTransitions` (counts
//!   changes of holder), so `kubectl get leases` / `kubectl describe lease` show holder and times;
//! - **annotations** under `leasehold.io/`: `key`, `fence`, `token` (owner token), `holder` and
//!   `renewed` (the `holderIdentity` and `renewTime` written with that token), `expires`
//!   (renewTime + the TTL to the millisecond), `ttl-ms`, `waiter`, `waiter-token`,
//!   `waiter-expires`, `pid`, `host`, `labels`, and `unclaimed: "true"` on a lease a release
//!   granted to the first in line that has not claimed it yet; labels and annotations of others
//!   are kept;
//! - **the spec is the truth** every client reads, client-go's and the Python client's leader
//!   election included: a Lease whose `holderIdentity` is set is held by that holder until
//!   `renewTime + leaseDurationSeconds`, read afresh each time. leasehold's annotations add to
//!   that (owner token, exact expiry, fence) only while they describe the same lease: their
//!   `holder` and `renewed` are the spec's. Once another client has taken or renewed the Lease
//!   they no longer are, and the spec alone counts; damaged annotations never free a Lease the
//!   spec says is held. A leasehold waiting on another client's Lease writes only its key, fence
//!   and waiter annotations, leaving the spec and everything else as read;
//! - **writes**: every write is conditioned on `resourceVersion` — create (409 AlreadyExists = lost
//!   the race), replace with the version read (409 Conflict = somebody else won: contention, not an
//!   error), delete with `preconditions.resourceVersion`. Release is a conditional replace that
//!   clears the holder and keeps the fence; nothing is ever written unconditionally;
//! - **fence**: from the API server's `resourceVersion`, which every API server backed by etcd
//!   (and kine) answers as the store-wide revision: a number every later write in the cluster
//!   exceeds, a deletion included. A grant on an existing Lease takes the previous fence plus its
//!   block; a grant that creates the Lease (first use, after `cleanup`, after `kubectl delete
//!   lease`) gets `2⁵³ + revision of the create × 2²⁴ + block − 1` (the create writes a marker in
//!   `leasehold.io/store`; the creator's next request stores the number in
//!   `leasehold.io/fence`, so a create costs two requests). Neither a
//!   deleted Lease nor a pod's lagging clock can make a fence go backwards; no clock is read. The
//!   limits: a `resourceVersion` that is not a decimal number (no known API server answers one)
//!   falls back to `max(previous + 1, µs wall clock)`; a block of 2²⁴ fences or more per grant is
//!   not covered; fences written before this scheme (µs clock values, below 2⁵³) are continued;
//! - **expiry** is judged by observation ([`crate::adapter`]): a contender takes a held Lease only
//!   once it has seen the holder's part of it (`leasehold.io/token`, `fence`, `renewTime`,
//!   `leasehold.io/expires` …; for Leases of other clients such as client-go leader election,
//!   `holderIdentity`, `renewTime`, `leaseDurationSeconds`) unchanged for the TTL plus 1 % + 2 ms
//!   on its own monotonic clock, exactly like client-go's leader election; or when the written
//!   expiry is older than now − `max_clock_skew` (default 5 minutes) on its wall clock. Pods'
//!   wall clocks may differ by anything below that bound without shortening a lease;
//! - **waiters** record their registration's lifetime (`leasehold.io/waiter-ttl-ms`), and other
//!   contenders judge it lapsed by observation too;
//! - **watch**: waiters are woken by a watch on their Lease (`fieldSelector=metadata.name=…`);
//! - **errors**: `403 Forbidden` names the missing RBAC verb and rule; `5xx`, `429` and transport
//!   failures are retryable [`Error::Unavailable`].
//!
//! Configuration: `KUBECONFIG` (or `~/.kube/config`), else the in-cluster service account; the
//! namespace is the URL's host, else `POD_NAMESPACE`, else the kubeconfig's namespace, else
//! `default`. `?server=http://127.0.0.1:PORT` talks to that API server directly without
//! credentials (for tests against `leasehold-apiserver`). `?prefix=` sets the name prefix
//! (default `leasehold-`), `?timeout=` the per-request timeout (default `10s`),
//! `?max_clock_skew=` the largest difference between pods' wall clocks assumed (default `5m`).

mod floor;
mod options;

use crate::error::{Error, Result};
use crate::key::{Key, Naming};
use crate::record::{format_ms as fmt_ms, parse_ms, LeaseRecord};
use crate::store::{Capabilities, ChangeWatch, RecordStore, Stored};
use async_trait::async_trait;
use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::chrono::{DateTime, Utc};
use kube::api::{
    Api, DeleteParams, ListParams, PostParams, Preconditions, WatchEvent, WatchParams,
};
pub use options::KubernetesOptions;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

/// The label every Lease of leasehold carries.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "leasehold");
/// The prefix of leasehold's annotations.
pub const ANNOTATION_PREFIX: &str = "leasehold.io/";
/// The default Lease name prefix.
pub const DEFAULT_PREFIX: &str = "leasehold-";

const RBAC_HINT: &str =
    "deploy/kubernetes/rbac.yaml grants exactly get, list, watch, create, update, delete on leases";

/// The owner token leasehold reads for a Lease that another client holds: this prefix and its
/// `holderIdentity`. Never written to a Lease.
const FOREIGN_TOKEN: &str = "k8s-holder:";

/// The annotations leasehold writes on a Lease that another client holds (its key and fence
/// floor, and a waiter registration); the spec and every other annotation stay as read.
const WAITER_ANNOTATIONS: [&str; 7] = [
    "key",
    "fence",
    "waiter",
    "waiter-token",
    "waiter-expires",
    "waiter-ttl-ms",
    "queue",
];

/// A [`RecordStore`] over `coordination.k8s.io/v1` Leases; wrap it in
/// [`crate::adapter::RecordLockStore`] (as `open_store("k8s://…")` does) for a lock store.
pub struct KubernetesStore {
    api: Api<Lease>,
    namespace: String,
    naming: Naming,
    describe: String,
    timeout: Duration,
    /// Lease name → the Lease as last read or written, so that a replace of that version keeps
    /// what leasehold does not own (another client's spec, foreign labels and annotations) and
    /// can count a change of holder.
    seen: Mutex<HashMap<String, Lease>>,
}

impl fmt::Debug for KubernetesStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubernetesStore")
            .field("store", &self.describe)
            .finish_non_exhaustive()
    }
}

pub(super) fn valid_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

impl KubernetesStore {
    /// Connects with `options`: the store of records; [`crate::adapter::RecordLockStore`] over
    /// it (with the options' `max_clock_skew`) is the lock store, as `open_store("k8s://…")`
    /// makes it.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a bad namespace, prefix, server or timeout;
    /// [`Error::Unavailable`] when no cluster configuration can be found.
    ///
    /// ```no_run
    /// # async fn f() -> leasehold::Result<()> {
    /// use leasehold::adapter::RecordLockStore;
    /// use leasehold::stores::kubernetes::{KubernetesOptions, KubernetesStore};
    /// let mut o = KubernetesOptions::default();
    /// o.namespace = Some("jobs".into());
    /// let skew = o.max_clock_skew;
    /// let store = RecordLockStore::new(KubernetesStore::connect(o).await?).with_max_clock_skew(skew);
    /// let locks = leasehold::Locks::new(store);
    /// # drop(locks); Ok(()) }
    /// ```
    pub async fn connect(options: KubernetesOptions) -> Result<Self> {
        options.check()?;
        let (mut config, via) = match &options.server {
            Some(server) => {
                let uri = options::server_uri(server)?;
                (kube::Config::new(uri), format!("?server={server}"))
            }
            None => (
                kube::Config::infer().await.map_err(|e| Error::Unavailable {
                    source: None,
                    store: "k8s://".into(),
                    detail: format!("no cluster configuration (KUBECONFIG, ~/.kube/config or in-cluster service account): {e}"),
                })?,
                String::new(),
            ),
        };
        let namespace = match options.namespace {
            Some(ns) => ns,
            None => match std::env::var("POD_NAMESPACE") {
                Ok(ns) if !ns.is_empty() => ns,
                _ => config.default_namespace.clone(),
            },
        };
        options::check_namespace(&namespace)?;
        config.read_timeout = Some(options.timeout.max(Duration::from_secs(300)));
        config.connect_timeout = Some(options.timeout);
        let client = kube::Client::try_from(config).map_err(|e| Error::Unavailable {
            source: None,
            store: format!("k8s://{namespace}"),
            detail: format!("cannot build a Kubernetes client: {e}"),
        })?;
        let sep = if via.is_empty() { "?" } else { "&" };
        Ok(KubernetesStore {
            api: Api::namespaced(client, &namespace),
            describe: format!("k8s://{namespace}{via}{sep}prefix={}", options.prefix),
            naming: Naming::dns1123(options.prefix),
            namespace,
            timeout: options.timeout,
            seen: Mutex::new(HashMap::new()),
        })
    }

    /// The namespace the Leases live in.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The Lease name of `key`.
    pub fn lease_name(&self, key: &Key) -> String {
        self.naming.name(key)
    }

    /// Runs one API call under the timeout, mapping errors.
    async fn call<T>(
        &self,
        verb: &'static str,
        name: &str,
        f: impl std::future::Future<Output = kube::Result<T>>,
    ) -> Result<std::result::Result<T, kube::core::ErrorResponse>> {
        match tokio::time::timeout(self.timeout, f).await {
            Err(_) => Err(Error::Unavailable {
                source: None,
                store: self.describe.clone(),
                detail: format!("{verb} lease {name}: no answer within {:?}", self.timeout),
            }),
            Ok(Ok(v)) => Ok(Ok(v)),
            Ok(Err(kube::Error::Api(e))) if matches!(e.code, 404 | 409) => Ok(Err(e)),
            Ok(Err(e)) => Err(self.error(verb, name, e)),
        }
    }

    fn error(&self, verb: &str, name: &str, e: kube::Error) -> Error {
        let store = self.describe.clone();
        let mapped = match &e {
            kube::Error::Api(r) if r.code == 403 => Error::Store {
                source: None,
                store,
                detail: format!(
                    "forbidden to {verb} lease {name}: {}. The RBAC Role bound to this identity needs a rule with apiGroups [\"coordination.k8s.io\"], resources [\"leases\"], verbs [\"{verb}\"] in namespace {} ({RBAC_HINT})",
                    r.message, self.namespace
                ),
                retryable: false,
            },
            kube::Error::Api(r) if r.code == 401 => Error::Store {
                source: None,
                store,
                detail: format!("unauthorized ({verb} lease {name}): the API server rejected the credentials: {}", r.message),
                retryable: false,
            },
            kube::Error::Api(r) if r.code >= 500 || r.code == 429 => Error::Unavailable {
                source: None,
                store,
                detail: format!("{verb} lease {name}: {} {}: {}", r.code, r.reason, r.message),
            },
            kube::Error::Api(r) => Error::Store {
                source: None,
                store,
                detail: format!("{verb} lease {name}: {} {}: {}", r.code, r.reason, r.message),
                retryable: false,
            },
            kube::Error::SerdeError(e) => Error::Store {
                source: None,
                store,
                detail: format!("{verb} lease {name}: the API server answered something that is not a Lease: {e}"),
                retryable: false,
            },
            e => Error::Unavailable {
                source: None,
                store,
                detail: format!("{verb} lease {name}: {e}"),
            },
        };
        mapped.caused_by(e)
    }

    fn remember(&self, name: &str, lease: &Lease) {
        if lease.metadata.resource_version.is_none() {
            return;
        }
        let mut seen = self.seen.lock();
        if seen.len() > 4096 {
            seen.clear();
        }
        seen.insert(name.to_owned(), lease.clone());
    }

    /// The Lease that stores `r` for `key` under `name`, replacing `version` (`None`: a create).
    ///
    /// A record leasehold holds (or a free one) is written whole: the spec and every
    /// `leasehold.io/` annotation. A record read from a Lease another client holds (its token is
    /// [`FOREIGN_TOKEN`]…) is written only as a waiter registration: the spec stays exactly as
    /// read, and of the annotations only [`WAITER_ANNOTATIONS`] are set. Labels, annotations and
    /// spec fields leasehold does not write are kept as read.
    fn to_lease(&self, name: &str, key: &Key, r: &LeaseRecord, version: Option<&str>) -> Lease {
        let base = version.and_then(|v| {
            self.seen
                .lock()
                .get(name)
                .filter(|l| l.metadata.resource_version.as_deref() == Some(v))
                .cloned()
        });
        let foreign = r
            .token
            .as_deref()
            .is_some_and(|t| t.starts_with(FOREIGN_TOKEN));
        let (mut meta, base_spec) = match base {
            Some(l) => (l.metadata, l.spec),
            None => (ObjectMeta::default(), None),
        };
        meta.name = Some(name.to_owned());
        meta.namespace = Some(self.namespace.clone());
        meta.resource_version = version.map(str::to_owned);
        meta.labels
            .get_or_insert_with(BTreeMap::new)
            .insert(MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned());
        let mut a = meta.annotations.take().unwrap_or_default();
        if foreign {
            for k in WAITER_ANNOTATIONS {
                a.remove(&format!("{ANNOTATION_PREFIX}{k}"));
            }
        } else {
            a.retain(|k, _| !k.starts_with(ANNOTATION_PREFIX));
        }
        let mut put = |k: &str, v: String| {
            a.insert(format!("{ANNOTATION_PREFIX}{k}"), v);
        };
        put("key", key.as_str().to_owned());
        put("fence", r.fence.to_string());
        if let Some(w) = &r.waiter {
            put("waiter", w.clone());
        }
        if let Some(w) = &r.waiter_token {
            put("waiter-token", w.clone());
        }
        if let Some(w) = r.waiter_expires_ms {
            put("waiter-expires", fmt_ms(w));
        }
        if let Some(w) = r.waiter_ttl_ms {
            put("waiter-ttl-ms", w.to_string());
        }
        if !r.queue.is_empty() {
            put("queue", serde_json::to_string(&r.queue).unwrap_or_default());
        }
        if let Some(t) = &r.permits {
            put("permits", serde_json::to_string(t).unwrap_or_default());
        }
        let micro = |ms: u64| {
            (ms > 0)
                .then(|| DateTime::<Utc>::from_timestamp_millis(ms as i64).map(MicroTime))
                .flatten()
        };
        let old_spec = base_spec.clone().unwrap_or_default();
        let spec = match base_spec {
            // Another client's lease: its spec is its own.
            Some(spec) if foreign => spec,
            _ => {
                let held = r.token.is_some();
                let transitions = match version {
                    None => 0,
                    Some(_) => {
                        let changed = r.holder.is_some() && r.holder != old_spec.holder_identity;
                        old_spec
                            .lease_transitions
                            .unwrap_or(0)
                            .saturating_add(i32::from(changed))
                    }
                };
                LeaseSpec {
                    holder_identity: if held { r.holder.clone() } else { None },
                    lease_duration_seconds: (r.ttl_ms > 0)
                        .then(|| r.ttl_ms.div_ceil(1000).min(i32::MAX as u64) as i32),
                    acquire_time: if held { micro(r.acquired_ms) } else { None },
                    renew_time: micro(r.renewed_ms),
                    lease_transitions: Some(transitions),
                    ..old_spec
                }
            }
        };
        if !foreign {
            put("ttl-ms", r.ttl_ms.to_string());
            if let (Some(t), Some(h)) = (&r.token, &spec.holder_identity) {
                put("token", t.clone());
                put("holder", h.clone());
                put("renewed", fmt_ms(micro_ms(&spec.renew_time)));
                put("expires", fmt_ms(r.expires_ms));
                if r.unclaimed {
                    put("unclaimed", "true".into());
                }
            }
            if let Some(p) = r.pid {
                put("pid", p.to_string());
            }
            if let Some(h) = &r.host {
                put("host", h.clone());
            }
            if !r.labels.is_empty() {
                put(
                    "labels",
                    serde_json::to_string(&r.labels).unwrap_or_default(),
                );
            }
            if !r.store.is_empty() {
                put("store", serde_json::to_string(&r.store).unwrap_or_default());
            }
        }
        meta.annotations = Some(a);
        Lease {
            metadata: meta,
            spec: Some(spec),
        }
    }
}

fn micro_ms(t: &Option<MicroTime>) -> u64 {
    t.as_ref()
        .map(|t| t.0.timestamp_millis().max(0) as u64)
        .unwrap_or(0)
}

/// A Lease's annotations.
type Annotations = BTreeMap<String, String>;

/// The annotation `leasehold.io/{k}`.
fn annotation<'a>(ann: &'a Annotations, k: &str) -> Option<&'a String> {
    ann.get(&format!("{ANNOTATION_PREFIX}{k}"))
}

/// Whether the `leasehold.io/` annotations describe the lease of the spec's holder `holder`: they
/// carry an owner token of leasehold's, written with that `holderIdentity` and `renewTime`. Once
/// another client has written the spec (taken the Lease, or renewed it), they no longer do.
fn annotations_hold(ann: &Annotations, spec: &LeaseSpec, holder: &str) -> bool {
    let get = |k: &str| annotation(ann, k);
    let Some(token) = get("token") else {
        return false;
    };
    if token.starts_with(FOREIGN_TOKEN) {
        return false;
    }
    let renewed = micro_ms(&spec.renew_time);
    match (get("holder"), get("renewed")) {
        (Some(h), Some(r)) => h == holder && parse_ms(r).ok() == Some(renewed),
        // Written by a leasehold that did not record these: its expiry is renewTime + TTL.
        (None, None) => {
            let ttl = get("ttl-ms").and_then(|t| t.parse::<u64>().ok());
            let expires = get("expires").and_then(|e| parse_ms(e).ok());
            matches!((ttl, expires), (Some(t), Some(e)) if e.checked_sub(t) == Some(renewed))
        }
        _ => false,
    }
}

/// The record of a Lease as its spec says: held by `holderIdentity` (if set) until `renewTime +
/// leaseDurationSeconds`, with the owner token [`FOREIGN_TOKEN`]`holder`. Of the annotations only
/// leasehold's key, fence floor and waiter registration are read, leniently: nothing in them can
/// make the spec's holder look gone.
fn spec_record(name: &str, ann: &Annotations, spec: &LeaseSpec) -> LeaseRecord {
    let get = |k: &str| annotation(ann, k);
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
    let key = get("key").map_or(name, String::as_str);
    let fence = get("fence").and_then(|f| f.parse().ok()).unwrap_or(0);
    let mut r = LeaseRecord::free(key, fence);
    r.acquired_ms = micro_ms(&spec.acquire_time);
    r.renewed_ms = micro_ms(&spec.renew_time);
    r.ttl_ms = u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0) * 1000;
    if let Some(h) = holder {
        r.token = Some(format!("{FOREIGN_TOKEN}{h}"));
        r.holder = Some(h);
        r.expires_ms = r.renewed_ms + r.ttl_ms;
    }
    r.waiter = get("waiter").cloned();
    r.waiter_token = get("waiter-token").cloned();
    r.waiter_expires_ms = get("waiter-expires").and_then(|w| parse_ms(w).ok());
    r.waiter_ttl_ms = get("waiter-ttl-ms").and_then(|w| w.parse().ok());
    r.queue = get("queue")
        .and_then(|q| serde_json::from_str(q).ok())
        .unwrap_or_default();
    r
}

/// The record a Lease holds, or why it cannot be read.
///
/// The spec is the truth every client reads: a Lease whose `holderIdentity` is set is held by
/// that holder, until `renewTime + leaseDurationSeconds` ([`spec_record`]), unless leasehold's
/// annotations describe that very lease ([`annotations_hold`]), which then add its owner token,
/// exact expiry, fence and labels. A Lease with no holder is free; its annotations (fence floor,
/// waiter) still count, and damaged ones make it [`Stored::Corrupt`].
fn from_lease(lease: &Lease) -> std::result::Result<LeaseRecord, String> {
    let empty = BTreeMap::new();
    let ann = lease.metadata.annotations.as_ref().unwrap_or(&empty);
    let spec = lease.spec.clone().unwrap_or_default();
    let name = lease.metadata.name.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
    match &holder {
        Some(h) if annotations_hold(ann, &spec, h) => {
            // Damaged annotations cannot free a lease the spec says is held.
            Ok(own_record(ann, &spec, holder.clone())
                .unwrap_or_else(|_| spec_record(&name, ann, &spec)))
        }
        Some(_) => Ok(spec_record(&name, ann, &spec)),
        None if annotation(ann, "key").is_none() => Ok(spec_record(&name, ann, &spec)),
        None => own_record(ann, &spec, None),
    }
}

/// The record leasehold's annotations describe, held by `holder` (the spec's) if they carry a
/// token, or why they cannot be read.
fn own_record(
    ann: &Annotations,
    spec: &LeaseSpec,
    holder: Option<String>,
) -> std::result::Result<LeaseRecord, String> {
    let get = |k: &str| annotation(ann, k);
    let num = |k: &str| -> std::result::Result<Option<u64>, String> {
        get(k)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|e| format!("annotation {ANNOTATION_PREFIX}{k}={v:?}: {e}"))
            })
            .transpose()
    };
    let time = |k: &str| -> std::result::Result<Option<u64>, String> {
        get(k).map(|v| parse_ms(v)).transpose()
    };
    let key = get("key").ok_or("annotation leasehold.io/key missing")?;
    let mut r = LeaseRecord::free(
        key,
        num("fence")?.ok_or("annotation leasehold.io/fence missing")?,
    );
    let expires = time("expires")?;
    let token = get("token").cloned();
    if let (Some(token), Some(holder)) = (token, holder) {
        r.token = Some(token);
        r.holder = Some(holder);
        r.expires_ms = expires.ok_or("annotation leasehold.io/expires missing on a held lease")?;
        r.unclaimed = get("unclaimed").is_some_and(|v| v == "true");
    }
    r.ttl_ms = num("ttl-ms")?.unwrap_or(0);
    r.acquired_ms = micro_ms(&spec.acquire_time);
    r.renewed_ms = micro_ms(&spec.renew_time);
    r.waiter = get("waiter").cloned();
    r.waiter_token = get("waiter-token").cloned();
    r.waiter_expires_ms = time("waiter-expires")?;
    r.waiter_ttl_ms = num("waiter-ttl-ms")?;
    if let Some(q) = get("queue") {
        r.queue =
            serde_json::from_str(q).map_err(|e| format!("annotation leasehold.io/queue: {e}"))?;
    }
    if let Some(t) = get("permits") {
        r.permits = Some(
            serde_json::from_str(t).map_err(|e| format!("annotation leasehold.io/permits: {e}"))?,
        );
    }
    r.pid = num("pid")?.and_then(|p| u32::try_from(p).ok());
    r.host = get("host").cloned();
    if let Some(l) = get("labels") {
        r.labels =
            serde_json::from_str(l).map_err(|e| format!("annotation leasehold.io/labels: {e}"))?;
    }
    if let Some(s) = get("store") {
        r.store =
            serde_json::from_str(s).map_err(|e| format!("annotation leasehold.io/store: {e}"))?;
    }
    Ok(r)
}

pub(crate) fn stored(lease: &Lease) -> Stored {
    let version = lease.metadata.resource_version.clone().unwrap_or_default();
    match from_lease(lease) {
        Ok(record) => Stored::Record { record, version },
        Err(detail) => Stored::Corrupt {
            version,
            detail,
            salvaged_fence: lease
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("leasehold.io/fence"))
                .and_then(|f| f.parse().ok()),
        },
    }
}

#[async_trait]
impl RecordStore for KubernetesStore {
    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn floor(&self) -> Option<std::sync::Arc<dyn crate::floor::Floor>> {
        Some(std::sync::Arc::new(floor::KubernetesFloor::new(self)))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_ttl: false,
            watch: true,
            liveness: false,
            fence_source: "the API server's resourceVersion (an etcd revision), kept in the leasehold.io/fence annotation",
            waiter_line: true,
            release_grants: true,
            permits: true,
            expiry_clock: crate::store::ExpiryClock::Clients,
        }
    }

    /// The spec says who holds a Lease; a Lease reads as corrupt only when its spec is free (no
    /// `holderIdentity`) and leasehold's annotations are damaged.
    fn corrupt_holds_nothing(&self) -> bool {
        true
    }

    async fn get(&self, key: &Key) -> Result<Option<Stored>> {
        let name = self.lease_name(key);
        match self.call("get", &name, self.api.get(&name)).await? {
            Ok(lease) => {
                self.remember(&name, &lease);
                Ok(Some(stored(&lease)))
            }
            Err(_) => Ok(None),
        }
    }

    async fn create(&self, key: &Key, record: &LeaseRecord) -> Result<Option<String>> {
        let name = self.lease_name(key);
        let lease = self.to_lease(&name, key, record, None);
        match self
            .call(
                "create",
                &name,
                self.api.create(&PostParams::default(), &lease),
            )
            .await?
        {
            Ok(l) => {
                self.remember(&name, &l);
                Ok(Some(l.metadata.resource_version.unwrap_or_default()))
            }
            Err(_) => Ok(None),
        }
    }

    async fn replace(
        &self,
        key: &Key,
        record: &LeaseRecord,
        version: &str,
    ) -> Result<Option<String>> {
        let name = self.lease_name(key);
        let lease = self.to_lease(&name, key, record, Some(version));
        match self
            .call(
                "update",
                &name,
                self.api.replace(&name, &PostParams::default(), &lease),
            )
            .await?
        {
            Ok(l) => {
                self.remember(&name, &l);
                Ok(Some(l.metadata.resource_version.unwrap_or_default()))
            }
            Err(_) => Ok(None),
        }
    }

    async fn delete(&self, key: &Key, version: &str) -> Result<bool> {
        let name = self.lease_name(key);
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(version.to_owned()),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        Ok(self
            .call("delete", &name, self.api.delete(&name, &dp))
            .await?
            .is_ok())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, Stored)>> {
        let lp = ListParams::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1));
        let list = match self.call("list", "(all)", self.api.list(&lp)).await? {
            Ok(l) => l,
            Err(e) => return Err(self.error("list", "(all)", kube::Error::Api(e))),
        };
        let mut out: Vec<(String, Stored)> = list
            .items
            .iter()
            .filter_map(|l| {
                let s = stored(l);
                let matches = match &s {
                    Stored::Record { record, .. } => record.key.starts_with(prefix),
                    Stored::Corrupt { .. } => prefix.is_empty(),
                };
                matches.then(|| (l.metadata.name.clone().unwrap_or_default(), s))
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    fn revisions(&self) -> bool {
        true
    }

    fn revision(&self, version: &str) -> Option<u64> {
        version.parse().ok()
    }

    async fn subscribe(&self, key: &Key) -> Result<Option<Box<dyn ChangeWatch>>> {
        let name = self.lease_name(key);
        let fields = format!("metadata.name={name}");
        // The list's resourceVersion anchors the watch: no change after it is missed, even one
        // made before the watch request reaches the server.
        let list = match self
            .call(
                "list",
                &name,
                self.api.list(&ListParams::default().fields(&fields)),
            )
            .await?
        {
            Ok(l) => l,
            Err(e) => return Err(self.error("list", &name, kube::Error::Api(e))),
        };
        let mut rv = list.metadata.resource_version.unwrap_or_default();
        let (tx, rx) = tokio::sync::watch::channel(0u64);
        let api = self.api.clone();
        let waiter: std::sync::Arc<parking_lot::Mutex<Option<String>>> = Default::default();
        let serves = waiter.clone();
        let task = tokio::spawn(async move {
            let wp = WatchParams::default().fields(&fields).timeout(290);
            let mut backoff = Duration::from_millis(50);
            loop {
                if tx.is_closed() {
                    return;
                }
                let stream = match api.watch(&wp, &rv).await {
                    Ok(s) => s,
                    Err(_) => {
                        tx.send_modify(|n| *n += 1);
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                        continue;
                    }
                };
                backoff = Duration::from_millis(50);
                futures_util::pin_mut!(stream);
                while let Some(ev) = stream.next().await {
                    match ev {
                        Ok(
                            WatchEvent::Added(l) | WatchEvent::Modified(l) | WatchEvent::Deleted(l),
                        ) => {
                            if let Some(v) = l.metadata.resource_version.clone() {
                                rv = v;
                            }
                            if concerns(&l, serves.lock().as_deref()) {
                                tx.send_modify(|n| *n += 1);
                            }
                        }
                        Ok(WatchEvent::Bookmark(b)) => rv = b.metadata.resource_version,
                        Ok(WatchEvent::Error(_)) | Err(_) => {
                            // Expired or broken: start over from the current state.
                            rv = String::new();
                            tx.send_modify(|n| *n += 1);
                            break;
                        }
                    }
                }
            }
        });
        Ok(Some(Box::new(LeaseWatch { rx, task, waiter })))
    }
}

/// Whether a change that left `lease` as it is concerns the waiting acquisition `waiter` (any
/// change concerns a watch that serves no waiter): the key came free, or is granted to it, or
/// cannot be read. A lease another holds, claimed or granted, does not: the waiter stays in line
/// (its place is renewed by its timer), and the release that ends that lease wakes it.
fn concerns(lease: &Lease, waiter: Option<&str>) -> bool {
    let Some(me) = waiter else {
        return true;
    };
    match from_lease(lease) {
        Ok(r) => match r.token.as_deref() {
            None => true,
            Some(t) => t == me,
        },
        Err(_) => true,
    }
}

/// A watch on one Lease; the watching task ends when this is dropped.
struct LeaseWatch {
    rx: tokio::sync::watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
    /// The waiting acquisition it serves ([`ChangeWatch::for_waiter`]), read by the task.
    waiter: std::sync::Arc<parking_lot::Mutex<Option<String>>>,
}

impl fmt::Debug for LeaseWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseWatch").finish_non_exhaustive()
    }
}

impl Drop for LeaseWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[async_trait]
impl ChangeWatch for LeaseWatch {
    async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            // The watching task is gone: fall back to polling.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    fn for_waiter(&mut self, token: &str) -> bool {
        *self.waiter.lock() = Some(token.to_owned());
        true
    }
}

#[cfg(test)]
mod tests;
