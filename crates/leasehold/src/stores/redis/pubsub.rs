//! Pub/sub for waiters: one subscribed connection per server ([`Hub`]; per primary on a
//! cluster) whose messages wake the subscriptions of each record's channel ([`RedisWatch`]), and
//! which is given up, its waiters told, when its connection ends or stops answering.

use super::conn::bounded;
use crate::error::Result;
use crate::store::ChangeWatch;
use ::redis::aio::PubSubSink;
use async_trait::async_trait;
use futures_util::StreamExt;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::watch;

/// How often a hub with subscriptions checks that its server still answers (an `UNSUBSCRIBE` of a
/// channel no record has, on its connection, bounded by the store's timeout).
const HUB_CHECK: Duration = Duration::from_secs(1);

/// One pub/sub connection per store (per node on a cluster), fanning messages out to per-channel
/// watch channels.
///
/// A connection that ends (the server closed it) or stops answering (a server that hangs, such as
/// an old primary after a failover, keeps its connection open and silent) ends the hub: its
/// subscriptions turn stale ([`ChangeWatch::stale`]) and are woken, and their waiters subscribe
/// again, through a new hub on the server the store now uses.
pub(crate) struct Hub {
    sink: PubSubSink,
    subs: Subs,
    alive: watch::Receiver<bool>,
    /// The store's per-call timeout, which bounds waiting for a subscription's confirmation.
    timeout: Duration,
}

/// Each channel's watch sender and how many subscriptions share it.
type SubMap = Mutex<HashMap<String, (watch::Sender<()>, usize)>>;
type Subs = Arc<SubMap>;

impl Hub {
    /// A hub on `client`'s server, its connection checked with `probe`, a channel no record has
    /// (the record prefix: keys are never empty).
    pub(crate) async fn start(
        client: &::redis::Client,
        probe: &str,
        store: &str,
        timeout: Duration,
    ) -> Result<Arc<Hub>> {
        let pubsub = bounded(
            store,
            timeout,
            "no pub/sub connection",
            client.get_async_pubsub(),
        )
        .await?;
        let (sink, mut stream) = pubsub.split();
        let subs: Subs = Arc::default();
        let (alive_tx, alive) = watch::channel(true);
        let alive_tx = Arc::new(alive_tx);
        // The reader and the check hold the subscriptions weakly: once the hub and every
        // subscription are dropped, the check ends, the connection's last sink goes, and so does
        // the reader.
        let (fan, ended) = (Arc::downgrade(&subs), alive_tx.clone());
        let reader = tokio::spawn(async move {
            while let Some(msg) = stream.next().await {
                let Some(subs) = fan.upgrade() else {
                    break;
                };
                let map = subs.lock();
                if let Some((tx, _)) = map.get(msg.get_channel_name()) {
                    tx.send_replace(());
                }
            }
            hub_ended(&ended, &fan);
        });
        tokio::spawn(check(
            sink.clone(),
            Arc::downgrade(&subs),
            alive_tx,
            reader.abort_handle(),
            probe.to_owned(),
            store.to_owned(),
            timeout,
        ));
        Ok(Arc::new(Hub {
            sink,
            subs,
            alive,
            timeout,
        }))
    }

    /// Whether the hub has ended (its subscriptions hear nothing more).
    pub(crate) fn dead(&self) -> bool {
        !*self.alive.borrow()
    }

    /// A subscription to `channel`, confirmed by the server before it is returned when it is the
    /// channel's first (`store` names the store in errors).
    pub(super) async fn subscribe(
        self: &Arc<Self>,
        channel: String,
        store: &str,
    ) -> Result<RedisWatch> {
        let (rx, first) = {
            let mut map = self.subs.lock();
            let entry = map
                .entry(channel.clone())
                .or_insert_with(|| (watch::Sender::new(()), 0));
            entry.1 += 1;
            (entry.0.subscribe(), entry.1 == 1)
        };
        let (mut sink, subs) = (self.sink.clone(), self.subs.clone());
        let w = RedisWatch {
            rx,
            subs,
            channel: channel.clone(),
            sink: sink.clone(),
            alive: self.alive.clone(),
        };
        if first {
            // Confirmed by the server before we return: no release published after this is missed.
            // Bounded like every call: a server that stopped answering must not hold a waiter
            // past its wait limit.
            bounded(
                store,
                self.timeout,
                "no subscription confirmation",
                sink.subscribe(&channel),
            )
            .await?;
        }
        Ok(w)
    }
}

/// Marks a hub ended and wakes its subscriptions: their waiters look at the store again and,
/// seeing them stale, subscribe again.
fn hub_ended(alive: &watch::Sender<bool>, subs: &Weak<SubMap>) {
    alive.send_replace(false);
    if let Some(subs) = subs.upgrade() {
        for (tx, _) in subs.lock().values() {
            tx.send_replace(());
        }
    }
}

/// Every [`HUB_CHECK`] while a hub has subscriptions, sends `UNSUBSCRIBE probe` on its connection
/// (a subscribed RESP2 connection takes few commands: `PING` would do, but the least ACL a
/// deployment grants — see the book's Redis page, `docs/src/stores/redis.md#acl-users` — has no
/// `PING`, and a refusal every second would fill the ACL log). A connection that gives no answer within `timeout`, or fails, ends the hub (and its
/// reader, which a silent connection would keep waiting); any answer, an error too, is life. Ends
/// with the hub, or once nothing refers to its subscriptions.
async fn check(
    mut sink: PubSubSink,
    subs: Weak<SubMap>,
    alive: Arc<watch::Sender<bool>>,
    reader: tokio::task::AbortHandle,
    probe: String,
    store: String,
    timeout: Duration,
) {
    let mut every = tokio::time::interval_at(tokio::time::Instant::now() + HUB_CHECK, HUB_CHECK);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if !*alive.borrow() {
            return;
        }
        match subs.upgrade() {
            None => return,
            Some(s) if s.lock().is_empty() => continue,
            Some(_) => {}
        }
        let answered = tokio::time::timeout(timeout, sink.unsubscribe(&probe)).await;
        let alive_now = match answered {
            Ok(Ok(())) => true,
            Ok(Err(e)) => !(e.is_io_error() || e.is_connection_dropped()),
            Err(_) => false,
        };
        if !alive_now {
            tracing::warn!(store = %store, "the pub/sub connection does not answer; its waiters subscribe again");
            reader.abort();
            hub_ended(&alive, &subs);
            return;
        }
    }
}

/// A pub/sub subscription to one record's channel.
pub(super) struct RedisWatch {
    rx: watch::Receiver<()>,
    subs: Subs,
    channel: String,
    sink: PubSubSink,
    /// The hub's liveness: a subscription of an ended hub hears nothing more.
    alive: watch::Receiver<bool>,
}

impl std::fmt::Debug for RedisWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisWatch")
            .field("channel", &self.channel)
            .finish()
    }
}

#[async_trait]
impl ChangeWatch for RedisWatch {
    async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    fn stale(&self) -> bool {
        !*self.alive.borrow()
    }
}

impl Drop for RedisWatch {
    fn drop(&mut self) {
        let last = {
            let mut map = self.subs.lock();
            match map.get_mut(&self.channel) {
                Some(e) => {
                    e.1 -= 1;
                    if e.1 == 0 {
                        map.remove(&self.channel);
                        true
                    } else {
                        false
                    }
                }
                None => false,
            }
        };
        if last {
            if let Ok(h) = tokio::runtime::Handle::try_current() {
                let mut sink = self.sink.clone();
                let channel = std::mem::take(&mut self.channel);
                h.spawn(async move {
                    let _ = sink.unsubscribe(&channel).await;
                });
            }
        }
    }
}
