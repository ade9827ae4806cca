//! `ls`, `inspect`, `release --force` and `cleanup`.

use crate::cli::CleanupArgs;
use crate::exit::{Failure, OK};
use crate::follow::Follow;
use crate::output::{self, clean, print, print_json};
use crate::process::signals::Forwarded;
use crate::records::{
    corrupt_json, inspection_json, next_expiry, record_json, sort_key, state, waiter, watched,
    writes,
};
use leasehold::now_ms;
use leasehold::{Inspection, Key, LeaseRecord, LockStore, Permit, Permits};
use serde_json::Value;
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
            Inspection::Record(r) if r.permits.is_some() => permit_rows(r, now, &mut rows),
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

/// The `ls` rows of a semaphore or read-write key: one that says what it is, how many hold it,
/// its last fence, its state and its waiter; then one per holder, with its permit's fence and
/// the time left on it.
fn permit_rows(r: &LeaseRecord, now: u64, rows: &mut Vec<Vec<String>>) {
    let Some(t) = &r.permits else { return };
    rows.push(vec![
        clean(&r.key),
        output::permits_summary(t, now),
        r.fence.to_string(),
        state(r, now).into(),
        waiter(r, now).map_or_else(|| "-".into(), |w| clean(&w)),
    ]);
    for p in &t.holders {
        rows.push(vec![
            clean(&r.key),
            output::permit_holder(t, p),
            p.fence.to_string(),
            permit_remaining(p, now),
            String::new(),
        ]);
    }
}

/// The time left on a permit at `now`, or `expired`.
fn permit_remaining(p: &Permit, now: u64) -> String {
    if p.expires_ms > now {
        output::duration(Duration::from_millis(p.expires_ms - now))
    } else {
        "expired".into()
    }
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
    let mut follow = Follow::start(store, key.clone()).await?;
    let mut last = None;
    let mut away = false;
    // Whether the last look was made again at once because the lease changed while the store
    // was asked to notify its release.
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
        // If the lease changed while its release notification was asked for, look again at once
        // (once: a clock that disagrees with the store's on its expiry must not make a busy
        // loop).
        if !follow.seen(store, seen.as_ref(), now).await && !looked_again {
            looked_again = true;
            continue;
        }
        looked_again = false;
        let (line, object) = watched(key.as_str(), seen.as_ref(), now);
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
            if let Some(next) = next_expiry(r, now) {
                wait = wait.min(next + Duration::from_millis(1));
            }
        }
        tokio::select! {
            () = follow.changed() => {}
            () = tokio::time::sleep(wait) => {}
            _ = signals.recv() => return Ok(OK),
        }
    }
}

/// `leasehold release --force KEY [--holder ID]`: frees the lease or every permit of `key`, or
/// with `holder` only what that holder holds there.
pub(crate) async fn release(
    store: &dyn LockStore,
    key: Key,
    holder: Option<&str>,
) -> Result<u8, Failure> {
    let now = now_ms();
    let was = match holder {
        None => store.force_release(&key).await?,
        Some(who) => store.force_release_holder(&key, who).await?,
    };
    let k = key.as_str();
    let text = match (was, holder) {
        (Some(r), who) if r.permits.is_some() => {
            let freed: Vec<&Permit> = r
                .permits
                .iter()
                .flat_map(|t| &t.holders)
                .filter(|p| who.is_none_or(|w| p.holder == w || p.token == w))
                .collect();
            if freed.is_empty() {
                nothing_held(k, who)
            } else {
                let kind = match r.permits.as_ref().map(|t| t.kind) {
                    Some(leasehold::PermitKind::ReadWrite) => "the read-write lock",
                    _ => "the semaphore",
                };
                for p in &freed {
                    tracing::warn!(key = %key, holder = %p.holder, fence = p.fence, expired = p.expires_ms <= now, "permit force-released");
                }
                let list: Vec<String> = freed
                    .iter()
                    .map(|p| {
                        let name = r
                            .permits
                            .as_ref()
                            .map_or_else(|| clean(&p.holder), |t| output::permit_holder(t, p));
                        let expired = if p.expires_ms <= now {
                            ", already expired"
                        } else {
                            ""
                        };
                        format!("{name} (fence {}{expired})", p.fence)
                    })
                    .collect();
                let permits = if freed.len() == 1 {
                    "permit"
                } else {
                    "permits"
                };
                format!(
                    "released {} {permits} of {kind} {k:?}, held by {}\n",
                    freed.len(),
                    list.join(", ")
                )
            }
        }
        (Some(r), _) if r.token.is_some() => {
            let holder = r.holder.as_deref().unwrap_or("unknown");
            let expired = !r.is_held(now);
            tracing::warn!(key = %key, holder, fence = r.fence, expired, "lease force-released");
            format!(
                "released {k:?}: it was held by {} (fence {}{})\n",
                clean(holder),
                r.fence,
                if expired {
                    "; the lease had already expired"
                } else {
                    ""
                }
            )
        }
        (_, who) => nothing_held(k, who),
    };
    print(&text)?;
    Ok(OK)
}

/// What `release --force` says when there was nothing to free (for `who`, when given).
fn nothing_held(key: &str, who: Option<&str>) -> String {
    match who {
        None => format!("{key:?} was not held by anyone; nothing to release\n"),
        Some(w) => format!(
            "{} held nothing on {key:?} (no lease, no permit); nothing to release\n",
            clean(w)
        ),
    }
}

/// `leasehold cleanup`.
pub(crate) async fn cleanup(store: &dyn LockStore, args: CleanupArgs) -> Result<u8, Failure> {
    // On a terminal, keys done of keys found so far, as the store reports them.
    let bar = crate::progress::bar(
        0,
        "{spinner} {msg} [{bar:30}] {pos}/{len} keys {elapsed}",
        true,
    );
    bar.set_message(format!(
        "removing records free for over {}",
        humantime::format_duration(args.older_than)
    ));
    let progress = leasehold::CleanupProgress::new();
    let report = crate::progress::follow(&bar, store.cleanup(args.older_than, &progress), || {
        progress.get()
    })
    .await;
    bar.finish_and_clear();
    let report = report?;
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

/// The labels of a lease or permit for people: `a=b, c=d`, or `-`.
fn labels_text(labels: &std::collections::BTreeMap<String, String>) -> String {
    if labels.is_empty() {
        return "-".into();
    }
    labels
        .iter()
        .map(|(k, v)| format!("{}={}", clean(k), clean(v)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `waiter` field: the live waiter and when its registration lapses, or `-`.
fn waiter_text(r: &LeaseRecord, now: u64) -> String {
    match waiter(r, now) {
        Some(w) => format!(
            "{} (registration lapses at {})",
            clean(&w),
            output::time(r.waiter_expires_ms.unwrap_or(0))
        ),
        None => "-".into(),
    }
}

/// The fields that follow the holders: the line of waiters and the store's own.
fn trailing_fields<'a>(r: &'a LeaseRecord, fields: &mut Vec<(&'a str, String)>) {
    if !r.queue.is_empty() {
        let line: Vec<String> = r
            .queue
            .iter()
            .map(|w| {
                if writes(r, &w.token) {
                    format!("{} (write)", clean(&w.holder))
                } else {
                    clean(&w.holder)
                }
            })
            .collect();
        fields.push(("queued", line.join(", ")));
    }
    for (k, v) in &r.store {
        fields.push((k.as_str(), clean(v)));
    }
}

/// One `field: value` per line for a semaphore or read-write key: what it is and how many hold
/// it, the last fence it issued, and a `holder` line per permit (holder, read or write, fence,
/// expiry and time left, TTL, pid, host, labels).
fn permit_record_text(r: &LeaseRecord, t: &Permits, now: u64) -> String {
    let mut fields: Vec<(&str, String)> = vec![
        ("key", clean(&r.key)),
        ("state", state(r, now).into()),
        ("kind", output::permits_summary(t, now)),
        ("fence", r.fence.to_string()),
    ];
    if t.holders.is_empty() {
        fields.push(("holder", "-".into()));
    }
    for p in &t.holders {
        let left = permit_remaining(p, now);
        fields.push((
            "holder",
            format!(
                "{} fence {}, expires {} ({left}), ttl {}, pid {}, host {}, labels {}",
                output::permit_holder(t, p),
                p.fence,
                output::time(p.expires_ms),
                humantime::format_duration(Duration::from_millis(p.ttl_ms)),
                p.pid.map_or_else(|| "-".into(), |p| p.to_string()),
                p.host.as_deref().map_or_else(|| "-".into(), clean),
                labels_text(&p.labels),
            ),
        ));
    }
    fields.push(("waiter", waiter_text(r, now)));
    trailing_fields(r, &mut fields);
    fields.iter().map(|(k, v)| format!("{k}: {v}\n")).collect()
}

/// One `field: value` per line.
fn record_text(r: &LeaseRecord, now: u64) -> String {
    if let Some(t) = &r.permits {
        return permit_record_text(r, t, now);
    }
    let st = state(r, now);
    let opt = |o: &Option<String>| o.as_deref().map_or_else(|| "-".into(), clean);
    let waiter = waiter_text(r, now);
    let labels = labels_text(&r.labels);
    let mut fields: Vec<(&str, String)> = vec![
        ("key", clean(&r.key)),
        ("state", st.into()),
        (
            "holder",
            if r.unclaimed && st == "held" {
                format!(
                    "{} (granted by the release before, not claimed yet)",
                    opt(&r.holder)
                )
            } else {
                opt(&r.holder)
            },
        ),
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
    trailing_fields(r, &mut fields);
    fields.iter().map(|(k, v)| format!("{k}: {v}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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

    /// A read-write key read by `a` (live) and `b` (lapsed), a writer `w` waiting.
    fn read_write(now: u64) -> LeaseRecord {
        let t = |ms: u64| leasehold::format_ms(ms);
        serde_json::from_value(json!({
            "key": "catalog", "holder": null, "token": null, "fence": 12,
            "acquired": null, "renewed": null, "expires": null, "ttl_ms": 0,
            "waiter": "w", "waiter_token": "tw", "waiter_expires": t(now + 5_000),
            "permits": {
                "kind": "read-write",
                "holders": [
                    {"holder": "a", "token": "ta", "fence": 11, "acquired": t(now - 1_000),
                     "renewed": t(now - 1_000), "expires": t(now + 9_000), "ttl_ms": 10_000,
                     "pid": 7, "host": "h1"},
                    {"holder": "b", "token": "tb", "fence": 12, "acquired": t(now - 20_000),
                     "renewed": t(now - 20_000), "expires": t(now - 10_000), "ttl_ms": 10_000},
                ],
                "writers_waiting": ["tw"],
            },
        }))
        .unwrap()
    }

    #[test]
    fn permit_keys_show_every_holder() {
        let now = 1_790_000_000_000;
        let r = read_write(now);
        let text = record_text(&r, now);
        for want in [
            "state: held\n",
            "kind: read-write: 1 reader\n",
            "fence: 12\n",
            "holder: a (read) fence 11, expires 2026-09-21T14:13:29.000Z (9.0s), ttl 10s, pid 7, host h1, labels -\n",
            "holder: b (read) fence 12, expires 2026-09-21T14:13:10.000Z (expired), ttl 10s, pid -, host -, labels -\n",
            "waiter: w (write) (registration lapses at ",
        ] {
            assert!(text.contains(want), "{want:?} in\n{text}");
        }
        let v = record_json(&r, now);
        assert_eq!(v["state"], "held");
        assert_eq!(v["remaining_ms"], 9_000);
        let holders = v["permits"]["holders"].as_array().unwrap();
        assert_eq!(holders[0]["state"], "held");
        assert_eq!(holders[1]["state"], "expired");
        assert!(holders.iter().all(|p| p.get("token").is_none()), "{v}");
        assert_eq!(v["permits"]["writers_waiting"], json!(["w"]));
        let mut rows = vec![];
        permit_rows(&r, now, &mut rows);
        assert_eq!(rows[0][1], "read-write: 1 reader");
        assert_eq!(rows[0][3], "held");
        assert_eq!(rows[1][1..4], ["a (read)", "11", "9.0s"]);
        assert_eq!(rows[2][1..4], ["b (read)", "12", "expired"]);
        let key = Key::new("catalog").unwrap();
        let (line, _) = watched(key.as_str(), Some(&Inspection::Record(r.clone())), now);
        assert_eq!(
            line,
            "catalog held fence 12 (read-write: 1 reader) holder a (read) fence 11 holder b (read) fence 12 expired waiter w (write)"
        );
        // Nobody left: free, not held by a lock holder that is not there.
        let mut free = r;
        free.waiter = None;
        free.waiter_token = None;
        if let Some(t) = free.permits.as_mut() {
            t.holders.clear();
            t.kind = leasehold::PermitKind::Semaphore { permits: 4 };
        }
        assert_eq!(state(&free, now), "free");
        assert!(record_text(&free, now).contains("kind: semaphore 0/4 permits held\n"));
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
