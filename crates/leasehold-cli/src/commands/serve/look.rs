//! What `serve` shows, and how it hears of changes: a look at the store and the queue, and the
//! task that looks again whenever something may have changed and publishes what changed.

use crate::follow::Follow;
use crate::records::{next_expiry, sort_key, state, watched};
use leasehold::queue::{QueueBackend, Status};
use leasehold::{now_ms, Inspection, Key, LockStore};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, OnceCell};

/// The most held keys followed through the store's notifications at once; the others are seen
/// at the next look.
const FOLLOWED: usize = 256;

/// One look at the store and the queue.
#[derive(Debug, Clone)]
pub(crate) struct Look {
    /// The records under the prefix, sorted by key, or why the store did not answer.
    pub(crate) leases: Result<Vec<Inspection>, String>,
    /// The queue's status, or why it did not answer; `None` when there is no queue (the
    /// default one, not created yet).
    pub(crate) queue: Option<Result<Status, String>>,
}

/// The queue `serve` shows.
#[derive(Debug, Clone)]
pub(crate) enum QueueSource {
    /// The queue named with `--queue` or `LEASEHOLD_QUEUE`, opened at start.
    Named(Arc<dyn QueueBackend>),
    /// The default queue: shown once its file exists, opened then; `serve` never creates it.
    Default {
        /// Its file.
        path: PathBuf,
        /// Its URL.
        url: String,
        /// The queue, once opened.
        opened: Arc<OnceCell<Arc<dyn QueueBackend>>>,
    },
}

impl QueueSource {
    /// The default queue, not opened (nor created) until its file exists.
    pub(crate) fn default_queue() -> Self {
        QueueSource::Default {
            path: leasehold::defaults::queue_path(),
            url: leasehold::defaults::queue_url(None),
            opened: Arc::default(),
        }
    }

    /// The queue, `None` while there is none; an error when it cannot be opened.
    pub(crate) async fn get(&self) -> Option<leasehold::Result<Arc<dyn QueueBackend>>> {
        match self {
            QueueSource::Named(q) => Some(Ok(q.clone())),
            QueueSource::Default { path, url, opened } => {
                if let Some(q) = opened.get() {
                    return Some(Ok(q.clone()));
                }
                if !path.is_file() {
                    return None;
                }
                Some(
                    opened
                        .get_or_try_init(|| leasehold::queue::open_queue(url))
                        .await
                        .cloned(),
                )
            }
        }
    }

    /// The queue's status; `None` while there is none.
    pub(crate) async fn status(&self) -> Option<leasehold::Result<Status>> {
        Some(match self.get().await? {
            Ok(q) => q.status().await,
            Err(e) => Err(e),
        })
    }
}

/// Where `serve` looks.
#[derive(Debug, Clone)]
pub(crate) struct Sources {
    /// The lock store.
    pub(crate) store: Arc<dyn LockStore>,
    /// The queue.
    pub(crate) queue: QueueSource,
    /// The keys shown are those that start with this.
    pub(crate) prefix: String,
}

impl Sources {
    /// The records under the prefix, sorted by key.
    pub(crate) async fn leases(&self) -> leasehold::Result<Vec<Inspection>> {
        let mut all = self.store.list(&self.prefix).await?;
        all.sort_by(|a, b| sort_key(a).cmp(sort_key(b)));
        Ok(all)
    }

    /// A look at both; a failure is kept as its message.
    pub(crate) async fn look(&self) -> Look {
        Look {
            leases: self.leases().await.map_err(|e| e.to_string()),
            queue: self
                .queue
                .status()
                .await
                .map(|r| r.map_err(|e| e.to_string())),
        }
    }
}

/// What tells a change from a renewal-free look: each record as `watch --json` prints it (with
/// its expiry, so that a renewal is told and the page's countdowns follow it) and the queue.
fn signature(look: &Look, now: u64) -> String {
    let leases = match &look.leases {
        Ok(all) => all
            .iter()
            .map(|i| watched(sort_key(i), Some(i), now).1.to_string())
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("error {e}"),
    };
    let queue = match &look.queue {
        None => "none".to_owned(),
        Some(Ok(s)) => serde_json::to_string(s).unwrap_or_default(),
        Some(Err(e)) => format!("error {e}"),
    };
    format!("{leases}\n--\n{queue}")
}

/// Looks at the store and the queue whenever something may have changed and publishes each look
/// that differs from the last on `tx`, until every receiver is gone. A change is heard through
/// the store's notifications on the held keys (as `watch` hears it), at the next expiry, and at
/// the latest every `every` (keys taken under the prefix, the queue).
pub(crate) async fn follow(sources: Sources, every: Duration, tx: watch::Sender<Arc<Look>>) {
    let every = every.max(Duration::from_millis(10));
    let store = &*sources.store;
    let mut follows: HashMap<String, Follow> = HashMap::new();
    let mut last = String::new();
    loop {
        let look = sources.look().await;
        let now = now_ms();
        let mut wait = every;
        if let Ok(all) = &look.leases {
            let mut held: Vec<(&str, &Inspection)> = Vec::new();
            for i in all {
                if let Inspection::Record(r) = i {
                    if state(r, now) == "held" {
                        held.push((&r.key, i));
                        if let Some(next) = next_expiry(r, now) {
                            wait = wait.min(next + Duration::from_millis(1));
                        }
                    }
                }
            }
            follows.retain(|k, _| held.iter().any(|(h, _)| h == k));
            for (k, i) in held.into_iter().take(FOLLOWED) {
                if !follows.contains_key(k) {
                    let Ok(key) = Key::new(k) else { continue };
                    match Follow::start(store, key).await {
                        Ok(f) => {
                            follows.insert(k.to_owned(), f);
                        }
                        Err(e) => tracing::debug!(key = k, error = %e, "cannot follow the key"),
                    }
                }
                if let Some(f) = follows.get_mut(k) {
                    // A lease that changed while its release notification was asked for is
                    // seen at the next look: soon.
                    if !f.seen(store, Some(i), now).await {
                        wait = wait.min(Duration::from_millis(50));
                    }
                }
            }
        }
        let sig = signature(&look, now);
        if sig != last {
            last = sig;
            tx.send_replace(Arc::new(look));
        }
        let changed = async {
            if follows.is_empty() {
                std::future::pending::<()>().await;
            } else {
                let all = follows.values_mut().map(|f| Box::pin(f.changed()));
                futures_util::future::select_all(all).await;
            }
        };
        tokio::select! {
            () = changed => {}
            () = tokio::time::sleep(wait) => {}
            () = tx.closed() => return,
        }
    }
}
