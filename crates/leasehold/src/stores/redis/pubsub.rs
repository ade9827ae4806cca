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

/// What the subscriptions of one record's channel share.
struct Channel {
    /// Woken by every message.
    all: watch::Sender<()>,
    /// Woken by every message but a grant (`granted:<token>`, see [`RedisWatch`]).
    general: watch::Sender<()>,
    /// The waiting acquisitions of this process on the record, by token: a grant to one of
    /// them wakes it alone.
    waiters: HashMap<String, Arc<tokio::sync::Notify>>,
    /// How many subscriptions share the channel.
    count: usize,
    /// When the server confirmed the channel's subscription: every message published after
    /// that was heard.
    confirmed: Option<std::time::Instant>,
    /// The last [`HEARD_LOG`] messages, when they arrived, and the token each granted the lease
    /// to (`None`: not a grant), so that a watch made after an attempt can tell what it missed.
    log: std::collections::VecDeque<(std::time::Instant, Option<String>)>,
}

/// How many of a channel's latest messages it remembers ([`Channel::log`]).
const HEARD_LOG: usize = 128;

impl Channel {
    fn new() -> Self {
        Channel {
            all: watch::Sender::new(()),
            general: watch::Sender::new(()),
            waiters: HashMap::new(),
            count: 0,
            confirmed: None,
            log: std::collections::VecDeque::new(),
        }
    }

    /// Wakes the subscriptions a message concerns: a grant wakes the waiter it names (if it is
    /// one of ours) and the subscriptions that follow every change; anything else wakes all.
    fn heard(&mut self, payload: &[u8]) {
        self.all.send_replace(());
        let granted = payload
            .strip_prefix(b"granted:")
            .map(|t| String::from_utf8_lossy(t).into_owned());
        match &granted {
            Some(token) => {
                if let Some(n) = self.waiters.get(token) {
                    n.notify_one();
                }
            }
            None => {
                self.general.send_replace(());
            }
        }
        if self.log.len() == HEARD_LOG {
            self.log.pop_front();
        }
        self.log.push_back((std::time::Instant::now(), granted));
    }

    /// Whether a message that arrived at or after `since` concerns the waiter `token` (it is no
    /// grant, or a grant to it); `None` when the channel cannot tell (not confirmed before
    /// `since`, or its log no longer reaches back that far).
    fn missed(&self, since: std::time::Instant, token: &str) -> Option<bool> {
        if self.confirmed.is_none_or(|c| c >= since) {
            return None;
        }
        if self.log.len() == HEARD_LOG && self.log.front().is_some_and(|(t, _)| *t >= since) {
            return None;
        }
        Some(
            self.log
                .iter()
                .any(|(t, granted)| *t >= since && granted.as_deref().is_none_or(|g| g == token)),
        )
    }

    /// Wakes every subscription (the hub ended).
    fn wake_all(&self) {
        self.all.send_replace(());
        self.general.send_replace(());
        for n in self.waiters.values() {
            n.notify_one();
        }
    }
}

/// Each record channel's subscriptions.
type SubMap = Mutex<HashMap<String, Channel>>;
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
                let mut map = subs.lock();
                if let Some(c) = map.get_mut(msg.get_channel_name()) {
                    c.heard(msg.get_payload_bytes());
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
            let entry = map.entry(channel.clone()).or_insert_with(Channel::new);
            entry.count += 1;
            (entry.all.subscribe(), entry.count == 1)
        };
        let (mut sink, subs) = (self.sink.clone(), self.subs.clone());
        let w = RedisWatch {
            rx,
            waiter: None,
            pending: false,
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
            if let Some(c) = self.subs.lock().get_mut(&channel) {
                c.confirmed = Some(std::time::Instant::now());
            }
        }
        Ok(w)
    }
}

/// Marks a hub ended and wakes its subscriptions: their waiters look at the store again and,
/// seeing them stale, subscribe again.
fn hub_ended(alive: &watch::Sender<bool>, subs: &Weak<SubMap>) {
    alive.send_replace(false);
    if let Some(subs) = subs.upgrade() {
        for c in subs.lock().values() {
            c.wake_all();
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

/// A pub/sub subscription to one record's channel. It wakes at every message, or, once made a
/// waiter's ([`ChangeWatch::for_waiter`]), at every message but a grant to another waiter.
pub(super) struct RedisWatch {
    rx: watch::Receiver<()>,
    /// The waiting acquisition's token and its wake-up, once made a waiter's.
    waiter: Option<(String, Arc<tokio::sync::Notify>)>,
    /// A change it missed concerns it: the next `changed` completes at once.
    pending: bool,
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
        if std::mem::take(&mut self.pending) {
            return;
        }
        let any = async {
            if self.rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        match &self.waiter {
            Some((_, granted)) => tokio::select! {
                _ = any => {}
                _ = granted.notified() => {}
            },
            None => any.await,
        }
    }

    fn stale(&self) -> bool {
        !*self.alive.borrow()
    }

    fn for_waiter(&mut self, token: &str) -> bool {
        let mut map = self.subs.lock();
        let Some(c) = map.get_mut(&self.channel) else {
            return false;
        };
        let n = Arc::new(tokio::sync::Notify::new());
        c.waiters.insert(token.to_owned(), n.clone());
        let mut rx = c.general.subscribe();
        rx.mark_unchanged();
        self.rx = rx;
        self.waiter = Some((token.to_owned(), n));
        true
    }

    fn heard_since(&mut self, since: std::time::Instant) -> bool {
        let Some((token, _)) = &self.waiter else {
            return false;
        };
        let missed = match self.subs.lock().get(&self.channel) {
            Some(c) => c.missed(since, token),
            None => None,
        };
        match missed {
            Some(m) => {
                self.pending |= m;
                true
            }
            None => false,
        }
    }
}

impl Drop for RedisWatch {
    fn drop(&mut self) {
        let last = {
            let mut map = self.subs.lock();
            match map.get_mut(&self.channel) {
                Some(e) => {
                    if let Some((t, _)) = &self.waiter {
                        e.waiters.remove(t);
                    }
                    e.count -= 1;
                    if e.count == 0 {
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
