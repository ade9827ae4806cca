//! `ls`, `inspect`, `release --force` and `cleanup`.

use crate::cli::{CleanupArgs, ReleaseArgs};
use crate::exit::{Failure, OK};
use crate::output::{self, clean, print, print_json};
use crate::process::signals::Forwarded;
use leasehold::now_ms;
use leasehold::{Inspection, Key, LeaseRecord, LockStore};
use serde_json::{json, Value};
use std::time::Duration;

/// `leasehold ls`.
pub(crate) async fn ls(store: &dyn LockStore, prefix: &str, json: bool) -> Result<u8, Failure> {
    let mut all = store.list(prefix).await?;
    all.sort_by(|a, b| sort_key(a).cmp(sort_key(b)));
    let now = now_ms();
    if json {
        print_json(&Value::Array(
            all.iter().map(|i| inspection_json(i, now)).collect(),
        ))?;
        return Ok(OK);
    }
    let mut rows = Vec::with_capacity(all.len());
    let mut notes = String::new();
    for i in &all {
        match i {
            Inspection::Record(r) => rows.push(vec![
                clean(&r.key),
                match (&r.holder, state(r, now)) {
                    (Some(h), "held" | "expired") => clean(h),
                    _ => "-".into(),
                },
                r.fence.to_string(),
                match state(r, now) {
                    "held" => output::duration(r.remaining(now)),
                    other => other.into(),
                },
                waiter(r, now).map_or_else(|| "-".into(), |w| clean(&w)),
            ]),
            Inspection::Corrupt { name, detail } => {
                rows.push(vec![
                    clean(name),
                    "-".into(),
                    "-".into(),
                    "corrupt".into(),
                    "-".into(),
                ]);
                notes.push_str(&format!(
                    "corrupt record {}: {}\n",
                    clean(name),
                    clean(detail)
                ));
            }
        }
    }
    let mut text = output::table(&["KEY", "HOLDER", "FENCE", "EXPIRES IN", "WAITER"], &rows);
    if !notes.is_empty() {
        text.push('\n');
        text.push_str(&notes);
    }
    print(&text)?;
    Ok(OK)
}

/// `leasehold inspect KEY`.
pub(crate) async fn inspect(store: &dyn LockStore, key: Key, json: bool) -> Result<u8, Failure> {
    let now = now_ms();
    match store.inspect(&key).await? {
        None => Err(Failure::error(format!(
            "no lease record for key {:?} in {}",
            key.as_str(),
            leasehold::redact_url(&store.describe())
        ))),
        Some(Inspection::Corrupt { name, detail }) => {
            if json {
                print_json(&corrupt_json(&name, &detail))?;
            }
            Err(Failure::error(format!(
                "the record of key {:?} ({}) is corrupt: {}; the next acquisition of the key recovers it",
                key.as_str(),
                clean(&name),
                clean(&detail)
            )))
        }
        Some(Inspection::Record(r)) => {
            if json {
                print_json(&record_json(&r, now))?;
            } else {
                print(&record_text(&r, now))?;
            }
            Ok(OK)
        }
    }
}

/// How soon `watch` looks again at a store that answered with a retryable error.
const AWAY_RETRY: Duration = Duration::from_secs(1);

/// `leasehold watch KEY`: the key's state now and at every change (holder, fence, state, waiter;
/// not the renewals), until SIGTERM, SIGINT or SIGHUP (exit 0). A change is seen through the
/// store's notification where it has one, at the lease's expiry, and at the latest `every`.
pub(crate) async fn watch(
    store: &dyn LockStore,
    key: Key,
    json: bool,
    every: Duration,
) -> Result<u8, Failure> {
    let mut signals = Forwarded::install()
        .map_err(|e| Failure::error(format!("cannot install signal handlers: {e}")))?;
    let every = every.max(Duration::from_millis(10));
    let mut changes = store.subscribe(&key).await?;
    // Whether a lost subscription is still to be made again.
    let mut resubscribe = false;
    let mut last = None;
    let mut away = false;
    // The lease (its fence) whose release the store was asked to notify, and whether the last
    // look was made again at once because the lease changed while it was being asked.
    let mut notified: Option<u64> = None;
    let mut looked_again = false;
    loop {
        let now = now_ms();
        let seen = match store.inspect(&key).await {
            Ok(seen) => seen,
            // A store briefly away (a restart, a failover): said once per outage, looked at again
            // within a second, not a long `every` (its notifications may be gone with it).
            Err(e) if e.is_retryable() => {
                if !away {
                    crate::exit::report(&format!("{e}; watching on"));
                    away = true;
                }
                tokio::select! {
                    () = tokio::time::sleep(every.min(AWAY_RETRY)) => continue,
                    _ = signals.recv() => return Ok(OK),
                }
            }
            Err(e) => return Err(e.into()),
        };
        away = false;
        if resubscribe || changes.as_ref().is_some_and(|c| c.stale()) {
            // The notification's connection ended or its server stopped answering (a failover):
            // subscribe again; until that works, the store is looked at every `every`.
            changes = store.subscribe(&key).await.unwrap_or_default();
            resubscribe = changes.is_none();
        }
        // A store that notifies only the releases someone waits for (Redis, PostgreSQL) is
        // asked to notify this lease's; if it changed meanwhile, it is looked at again at once
        // (once: a clock that disagrees with the store's on its expiry must not make a busy
        // loop).
        match &seen {
            Some(Inspection::Record(r)) if r.is_held(now) => {
                if notified != Some(r.fence) {
                    match store.notify_release(&key, Some(r.fence)).await {
                        Ok(true) => notified = Some(r.fence),
                        Ok(false) if !looked_again => {
                            looked_again = true;
                            continue;
                        }
                        Ok(false) => {}
                        // Its release is then seen within `every`.
                        Err(e) => {
                            tracing::debug!(key = %key, error = %e, "cannot ask for the release to be notified")
                        }
                    }
                }
            }
            // Nothing held: the next lease is asked for, whatever its fence (a store that lost
            // its data may count fences again).
            _ => notified = None,
        }
        looked_again = false;
        let (line, object) = watched(&key, seen.as_ref(), now);
        if last.as_ref() != Some(&line) {
            if json {
                print(&format!("{object}\n"))?;
            } else {
                print(&format!("{line}\n"))?;
            }
            last = Some(line);
        }
        // Wake at the lease's expiry too: a store's own expiry sends no notification.
        let mut wait = every;
        if let Some(Inspection::Record(r)) = &seen {
            if r.is_held(now) {
                wait = wait.min(r.remaining(now) + Duration::from_millis(1));
            }
        }
        let changed = async {
            match changes.as_mut() {
                Some(c) => c.changed().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = changed => {}
            () = tokio::time::sleep(wait) => {}
            _ = signals.recv() => return Ok(OK),
        }
    }
}

/// What `watch` tells of a key: its line, and its JSON (the record as `inspect --json` shows it,
/// or `{"key": …, "state": "none"}`). The line leaves out what renewals change.
fn watched(key: &Key, seen: Option<&Inspection>, now: u64) -> (String, Value) {
    let k = clean(key.as_str());
    match seen {
        None => (
            format!("{k} none"),
            json!({"key": key.as_str(), "state": "none"}),
        ),
        Some(Inspection::Corrupt { name, detail }) => (
            format!("{k} corrupt {}", clean(detail)),
            corrupt_json(name, detail),
        ),
        Some(Inspection::Record(r)) => {
            let mut line = format!("{k} {} fence {}", state(r, now), r.fence);
            if let (Some(h), "held" | "expired") = (&r.holder, state(r, now)) {
                line.push_str(&format!(" holder {}", clean(h)));
            }
            if let Some(w) = waiter(r, now) {
                line.push_str(&format!(" waiter {}", clean(&w)));
            }
            let mut object = record_json(r, now);
            if let Some(o) = object.as_object_mut() {
                // Renewals change these; the line above does not show them either.
                o.remove("remaining_ms");
            }
            (line, object)
        }
    }
}

/// `release` needs `--force`: only the holder releases a lease otherwise.
pub(crate) fn check_force(args: &ReleaseArgs) -> Result<(), Failure> {
    if args.force {
        return Ok(());
    }
    Err(Failure::usage(
        "only the holder releases a lease (its `leasehold run` does when the command exits); \
         to free it whoever holds it, use `leasehold release --force KEY`",
    ))
}

/// `leasehold release --force KEY`.
pub(crate) async fn release(store: &dyn LockStore, key: Key) -> Result<u8, Failure> {
    let now = now_ms();
    match store.force_release(&key).await? {
        Some(r) if r.token.is_some() => {
            let holder = r.holder.as_deref().unwrap_or("unknown");
            let expired = !r.is_held(now);
            tracing::warn!(key = %key, holder, fence = r.fence, expired, "lease force-released");
            print(&format!(
                "released {:?}: it was held by {} (fence {}{})\n",
                key.as_str(),
                clean(holder),
                r.fence,
                if expired {
                    "; the lease had already expired"
                } else {
                    ""
                }
            ))?;
        }
        _ => print(&format!(
            "{:?} was not held by anyone; nothing to release\n",
            key.as_str()
        ))?,
    }
    Ok(OK)
}

/// `leasehold cleanup`.
pub(crate) async fn cleanup(store: &dyn LockStore, args: CleanupArgs) -> Result<u8, Failure> {
    let report = store.cleanup(args.older_than).await?;
    let plural = |n: usize| if n == 1 { "record" } else { "records" };
    print(&format!(
        "removed {} {}, kept {} {} (held, waited for, or touched within the last {})\n",
        report.removed,
        plural(report.removed),
        report.kept,
        plural(report.kept),
        humantime::format_duration(args.older_than)
    ))?;
    Ok(OK)
}

fn sort_key(i: &Inspection) -> &str {
    match i {
        Inspection::Record(r) => &r.key,
        Inspection::Corrupt { name, .. } => name,
    }
}

fn state(r: &LeaseRecord, now: u64) -> &'static str {
    output::state(r, now)
}

/// The live waiter's identity, if any.
fn waiter(r: &LeaseRecord, now: u64) -> Option<String> {
    r.has_live_waiter(now)
        .then(|| r.waiter.clone().unwrap_or_else(|| "unknown".into()))
}

/// A record as JSON: the stored record plus `state` (`held`, `expired`, `free`) and
/// `remaining_ms`, without the owner tokens (they let whoever knows them renew or release the
/// lease as its holder).
fn record_json(r: &LeaseRecord, now: u64) -> Value {
    let mut v = serde_json::to_value(r).unwrap_or_else(|_| json!({ "key": r.key }));
    if let Some(o) = v.as_object_mut() {
        o.remove("token");
        o.remove("waiter_token");
        if let Some(Value::Array(queue)) = o.get_mut("queue") {
            for w in queue.iter_mut().filter_map(Value::as_object_mut) {
                w.remove("token");
            }
        }
        o.insert("state".into(), state(r, now).into());
        o.insert(
            "remaining_ms".into(),
            u64::try_from(r.remaining(now).as_millis())
                .unwrap_or(u64::MAX)
                .into(),
        );
    }
    v
}

/// An inspection as JSON; a corrupt record is `{"state": "corrupt", "name": …, "detail": …}`.
fn inspection_json(i: &Inspection, now: u64) -> Value {
    match i {
        Inspection::Record(r) => record_json(r, now),
        Inspection::Corrupt { name, detail } => corrupt_json(name, detail),
    }
}

/// A corrupt record as JSON: `{"key": null, "state": "corrupt", "name": …, "detail": …}`.
fn corrupt_json(name: &str, detail: &str) -> Value {
    json!({
        "key": Value::Null,
        "state": "corrupt",
        "name": name,
        "detail": detail,
    })
}

/// One `field: value` per line.
fn record_text(r: &LeaseRecord, now: u64) -> String {
    let st = state(r, now);
    let opt = |o: &Option<String>| o.as_deref().map_or_else(|| "-".into(), clean);
    let waiter = match waiter(r, now) {
        Some(w) => format!(
            "{} (registration lapses at {})",
            clean(&w),
            output::time(r.waiter_expires_ms.unwrap_or(0))
        ),
        None => "-".into(),
    };
    let labels = if r.labels.is_empty() {
        "-".into()
    } else {
        r.labels
            .iter()
            .map(|(k, v)| format!("{}={}", clean(k), clean(v)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut fields: Vec<(&str, String)> = vec![
        ("key", clean(&r.key)),
        ("state", st.into()),
        ("holder", opt(&r.holder)),
        ("fence", r.fence.to_string()),
        ("acquired", output::time(r.acquired_ms)),
        ("renewed", output::time(r.renewed_ms)),
        ("expires", output::time(r.expires_ms)),
        (
            "remaining",
            if st == "held" {
                output::duration(r.remaining(now))
            } else {
                st.into()
            },
        ),
        (
            "ttl",
            if r.ttl_ms == 0 {
                "-".into()
            } else {
                humantime::format_duration(Duration::from_millis(r.ttl_ms)).to_string()
            },
        ),
        ("waiter", waiter),
        ("pid", r.pid.map_or_else(|| "-".into(), |p| p.to_string())),
        ("host", opt(&r.host)),
        ("labels", labels),
    ];
    if !r.queue.is_empty() {
        let line: Vec<String> = r.queue.iter().map(|w| clean(&w.holder)).collect();
        fields.push(("queued", line.join(", ")));
    }
    for (k, v) in &r.store {
        fields.push((k.as_str(), clean(v)));
    }
    fields.iter().map(|(k, v)| format!("{k}: {v}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(now: u64) -> LeaseRecord {
        let mut r = LeaseRecord::free("user:alice", 7);
        r.holder = Some("host-1-abc".into());
        r.token = Some("t".into());
        r.acquired_ms = now - 1_000;
        r.renewed_ms = now - 1_000;
        r.expires_ms = now + 29_000;
        r.ttl_ms = 30_000;
        r.pid = Some(42);
        r.labels.insert("team".into(), "core".into());
        r
    }

    #[test]
    fn record_text_has_one_field_per_line() {
        let now = 1_790_000_000_000;
        let text = record_text(&held(now), now);
        for want in [
            "holder: host-1-abc\n",
            "fence: 7\n",
            "state: held\n",
            "remaining: 29.0s\n",
            "pid: 42\n",
            "host: -\n",
            "labels: team=core\n",
            "waiter: -\n",
        ] {
            assert!(text.contains(want), "{want:?} in\n{text}");
        }
        let free = LeaseRecord::free("k", 3);
        let text = record_text(&free, now);
        assert!(
            text.contains("state: free\n") && text.contains("holder: -\n"),
            "{text}"
        );
    }

    #[test]
    fn record_json_adds_state() {
        let now = 1_790_000_000_000;
        let v = record_json(&held(now), now);
        assert_eq!(v["state"], "held");
        assert_eq!(v["fence"], 7);
        assert_eq!(v["remaining_ms"], 29_000);
        assert!(v.get("token").is_none(), "owner tokens stay private");
        let mut expired = held(now);
        expired.expires_ms = now - 1;
        assert_eq!(record_json(&expired, now)["state"], "expired");
    }
}
