//! Renewals, batched: the renewals queued when a batch leaves share one script call (on a cluster,
//! one per primary), each answered on its own ([`spawn_renewer`]).

#[cfg(feature = "redis-cluster")]
use super::cluster::{self, ClusterNodes};
use super::error::shared_error;
use super::link::Link;
#[cfg(feature = "redis-cluster")]
use super::link::Origin;
use super::scripts::{json_str, Lua, ScriptCall, Scripts};
use crate::error::{Error, Result};
use crate::record::LeaseRecord;
use crate::store::{LostReason, RenewOutcome};
#[cfg(feature = "redis-cluster")]
use std::collections::HashMap;
use std::sync::Arc;

/// One renewal waiting for the batcher.
pub(super) struct RenewJob {
    /// The record's Redis key.
    pub(super) record_key: String,
    /// The lease's key, naming it in errors.
    pub(super) key: String,
    pub(super) token: String,
    pub(super) ttl_ms: u64,
    /// Where the outcome goes.
    pub(super) reply: tokio::sync::oneshot::Sender<Result<RenewOutcome>>,
}

/// The most renewals one script call carries.
const RENEW_BATCH: usize = 1000;

/// How many renewal batches may be in flight at once.
const RENEW_IN_FLIGHT: usize = 8;

/// The renewal scripts: for one server or slot, and for one cluster node.
pub(super) struct RenewScripts {
    keyed: Lua,
    #[cfg(feature = "redis-cluster")]
    node: Lua,
    /// A node could not load the node script (a server before Redis 7, which knows no script
    /// flags): renewals go by slot from then on.
    #[cfg(feature = "redis-cluster")]
    node_refused: std::sync::atomic::AtomicBool,
}

impl RenewScripts {
    /// The renewal scripts among the store's `scripts`.
    pub(super) fn of(scripts: &Scripts) -> Self {
        RenewScripts {
            keyed: scripts.renew.clone(),
            #[cfg(feature = "redis-cluster")]
            node: scripts.renew_node.clone(),
            #[cfg(feature = "redis-cluster")]
            node_refused: Default::default(),
        }
    }
}

/// Renews in batches: the renewals queued when a batch leaves go into one script call (at most
/// [`RENEW_BATCH`]), so many leases held by one process cost one round trip per batch, not one
/// per lease. Up to [`RENEW_IN_FLIGHT`] batches are in flight at once (pipelined on the one
/// connection), so 10,000 leases coming due together are renewed in about one round trip.
/// Guards line their renewals up on a shared grid (see the guard), so a process's leases come
/// due together.
pub(super) fn spawn_renewer(
    link: Arc<Link>,
    scripts: RenewScripts,
) -> tokio::sync::mpsc::UnboundedSender<RenewJob> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<RenewJob>();
    let slots = Arc::new(tokio::sync::Semaphore::new(RENEW_IN_FLIGHT));
    let batcher = Arc::new((link, scripts));
    tokio::spawn(async move {
        while let Some(first) = rx.recv().await {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let mut batch = vec![first];
            while batch.len() < RENEW_BATCH {
                match rx.try_recv() {
                    Ok(j) => batch.push(j),
                    Err(_) => break,
                }
            }
            let batcher = batcher.clone();
            tokio::spawn(async move {
                let (link, scripts) = &*batcher;
                renew_batch(link, scripts, batch).await;
                drop(slot);
            });
        }
    });
    tx
}

/// Runs one batch of renewals and answers each job: one script call, or on a cluster one per
/// primary (see [`renew_on_nodes`]).
async fn renew_batch(link: &Arc<Link>, scripts: &RenewScripts, batch: Vec<RenewJob>) {
    #[cfg(feature = "redis-cluster")]
    if let Origin::Cluster(nodes) = &link.origin {
        return renew_on_nodes(link, nodes, scripts, batch).await;
    }
    let left = renew_call(link, &scripts.keyed, batch).await;
    refuse(link, left);
}

/// On a cluster: one call per primary of the slot map, naming no keys, for the records of all
/// the slots it serves (the call's answers are pipelined on the connections to each primary).
/// Records a primary no longer serves (a failover or resharding since the map was read) are
/// renewed by calls naming their keys ([`renew_by_slot`]), which follow the cluster's
/// redirections; so is the whole batch when there is no map or a node refuses the call itself
/// (a server older than Redis 7, out of memory).
#[cfg(feature = "redis-cluster")]
async fn renew_on_nodes(
    link: &Arc<Link>,
    nodes: &ClusterNodes,
    scripts: &RenewScripts,
    batch: Vec<RenewJob>,
) {
    use std::sync::atomic::Ordering;
    if scripts.node_refused.load(Ordering::Relaxed) {
        let all = batch.into_iter().map(|j| (j, String::new())).collect();
        return renew_by_slot(link, &scripts.keyed, all).await;
    }
    let conn = link.current.lock().1.clone();
    let groups = nodes
        .by_primary(
            &conn,
            batch,
            |j| &j.record_key,
            &link.described,
            link.timeout,
        )
        .await;
    let calls = groups.into_iter().map(|(route, jobs)| async move {
        let left = match route {
            Some(route) => match renew_node_call(link, &scripts.node, route, jobs).await {
                NodeRenewal::Answered(elsewhere) if !elsewhere.is_empty() => {
                    // Found out of date (a failover, a resharding): read again next time.
                    nodes.forget_map();
                    elsewhere
                }
                NodeRenewal::Answered(none) => none,
                NodeRenewal::Refused { jobs, lasting } => {
                    if lasting {
                        tracing::info!(store = %link.described, "the cluster does not take the renewal script for several slots (a server before Redis 7?); renewing by slot");
                        scripts.node_refused.store(true, Ordering::Relaxed);
                    }
                    jobs
                }
            },
            None => jobs.into_iter().map(|j| (j, String::new())).collect(),
        };
        if !left.is_empty() {
            renew_by_slot(link, &scripts.keyed, left).await;
        }
    });
    futures_util::future::join_all(calls).await;
}

/// How a node answered a renewal call for several slots.
#[cfg(feature = "redis-cluster")]
enum NodeRenewal {
    /// It ran: the jobs it answered `elsewhere` (with its error) are left.
    Answered(Vec<(RenewJob, String)>),
    /// It refused the call itself: every job is left; `lasting` when it cannot run the script at
    /// all (it does not compile there), not only now (out of memory, busy).
    Refused {
        jobs: Vec<(RenewJob, String)>,
        lasting: bool,
    },
}

/// Renews `batch` by calls naming their keys: one per slot (a script's keys must share one),
/// all at once.
#[cfg(feature = "redis-cluster")]
async fn renew_by_slot(link: &Arc<Link>, keyed: &Lua, batch: Vec<(RenewJob, String)>) {
    let mut by_slot: HashMap<_, Vec<RenewJob>> = HashMap::new();
    for (j, _) in batch {
        let slot = cluster::slot(&j.record_key);
        by_slot.entry(slot).or_default().push(j);
    }
    let calls = by_slot
        .into_values()
        .map(|g| async move { refuse(link, renew_call(link, keyed, g).await) });
    futures_util::future::join_all(calls).await;
}

/// Answers the renewals a script call naming their keys answered `elsewhere`: the server could
/// not read the record (an ACL denying the key, …).
fn refuse(link: &Link, left: Vec<(RenewJob, String)>) {
    for (j, detail) in left {
        let _ = j.reply.send(Err(Error::Store {
            source: None,
            store: link.described.clone(),
            detail: format!("cannot read the record {}: {detail}", j.record_key),
            retryable: false,
        }));
    }
}

/// The records and arguments of a renewal call for `batch`: the record names, then token, TTL
/// and token as a JSON string per record (as keys or as arguments: the call's `prepare` says).
fn renew_args(call: &mut ScriptCall, batch: &[RenewJob]) {
    for j in batch {
        call.arg(&j.record_key);
    }
    for j in batch {
        call.arg(&j.token).arg(j.ttl_ms).arg(json_str(&j.token));
    }
}

/// The size of a renewal call's keys and arguments, to size its buffer once.
fn renew_bytes(batch: &[RenewJob]) -> usize {
    batch
        .iter()
        .map(|j| j.record_key.len() + 3 * j.token.len() + 24)
        .sum()
}

/// Renews `batch` in one script call naming its keys, answers each job, and returns those the
/// server answered `elsewhere` (with its error).
async fn renew_call(
    link: &Arc<Link>,
    script: &Lua,
    batch: Vec<RenewJob>,
) -> Vec<(RenewJob, String)> {
    let mut call = script.prepare(batch.len(), 3 * batch.len(), renew_bytes(&batch));
    renew_args(&mut call, &batch);
    let call = &call;
    let res: Result<Vec<::redis::Value>> = link
        .send(|mut conn| async move { call.send(&mut conn).await })
        .await;
    match res {
        Ok(values) => answer_renewals(&values, batch),
        Err(e) => {
            fail_renewals(link, &e, batch);
            vec![]
        }
    }
}

/// Renews `batch` in one call of the node script sent to `route` (a slot of the node), answers
/// each job, and says which are left to renew by calls naming their keys: those the node
/// answered `elsewhere`, or all when the node refused the call itself.
#[cfg(feature = "redis-cluster")]
async fn renew_node_call(
    link: &Arc<Link>,
    script: &Lua,
    route: ::redis::cluster_routing::RoutingInfo,
    batch: Vec<RenewJob>,
) -> NodeRenewal {
    let mut call = script.prepare(0, 1 + 4 * batch.len(), renew_bytes(&batch));
    call.arg(batch.len());
    renew_args(&mut call, &batch);
    let (call, route) = (&call, &route);
    let res: Result<Vec<::redis::Value>> = link
        .send(|conn| async move { call.send_routed(conn, route.clone()).await })
        .await;
    match res {
        Ok(values) => NodeRenewal::Answered(answer_renewals(&values, batch)),
        Err(e @ Error::Unavailable { .. }) => {
            fail_renewals(link, &e, batch);
            NodeRenewal::Answered(vec![])
        }
        Err(e) => {
            tracing::debug!(store = %link.described, error = %e, "a node refused the renewal script; renewing by key");
            let text = e.to_string();
            // Redis 6 reads the flags line as Lua ("Error compiling script"); an older 7 may not
            // know the flag.
            let lasting = text.contains("compiling script")
                || text.contains("shebang")
                || text.contains("flag");
            NodeRenewal::Refused {
                jobs: batch.into_iter().map(|j| (j, text.clone())).collect(),
                lasting,
            }
        }
    }
}

/// Answers each job of `batch` from a renewal script's `values` (three per record), and returns
/// the jobs answered `elsewhere`, with the server's error.
fn answer_renewals(values: &[::redis::Value], batch: Vec<RenewJob>) -> Vec<(RenewJob, String)> {
    let mut left = vec![];
    for (i, j) in batch.into_iter().enumerate() {
        let text = |n: usize| -> String {
            values
                .get(3 * i + n)
                .and_then(|x| ::redis::from_redis_value_ref::<String>(x).ok())
                .unwrap_or_default()
        };
        let ok = values
            .get(3 * i)
            .and_then(|x| ::redis::from_redis_value_ref::<i64>(x).ok())
            .unwrap_or(0);
        let out = if ok == 1 {
            serde_json::from_str::<LeaseRecord>(&text(1))
                // A permit's holder is handed its permit in the lock fields.
                .map(|r| match r.permits {
                    Some(_) => crate::decide::view(&r, &j.token),
                    None => r,
                })
                .map(RenewOutcome::Renewed)
                .map_err(|e| Error::Corrupt {
                    key: j.key.clone(),
                    detail: e.to_string(),
                })
        } else {
            Ok(RenewOutcome::Lost(match text(1).as_str() {
                "elsewhere" => {
                    left.push((j, text(2)));
                    continue;
                }
                "expired" => LostReason::Expired,
                "taken" => LostReason::TakenOver { holder: text(2) },
                _ => LostReason::Released,
            }))
        };
        let _ = j.reply.send(out);
    }
    left
}

/// Answers every job of `batch` with the error `e` of the call that carried it.
fn fail_renewals(link: &Link, e: &Error, batch: Vec<RenewJob>) {
    for j in batch {
        let _ = j.reply.send(Err(shared_error(&link.described, e)));
    }
}
