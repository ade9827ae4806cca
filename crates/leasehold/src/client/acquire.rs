//! One acquisition: the local layer first, then store attempts until granted, refused or out of
//! time, waking on the store's change notification or a timer; what a caller that leaves early
//! leaves behind is undone in the background.

use super::Locks;
use crate::error::{Error, Result};
use crate::guard::{Grant, LeaseGuard};
use crate::key::Key;
use crate::local::LocalGuard;
use crate::options::{LockOptions, Wait};
use crate::record::now_ms;
use crate::store::{AcquireOutcome, AcquireRequest, GiveUp, LockStore};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The most fences one store acquisition reserves for the tasks of this process queued on a key
/// (so the most local handoffs before the lease goes back to the store, where other processes'
/// waiters get their turn).
const MAX_BLOCK: usize = 64;

/// Acquires `key` through `locks` with `opts` (checked first), counted in the metrics: the work
/// of [`LockBuilder::try_acquire`](super::LockBuilder::try_acquire) and
/// [`LockBuilder::acquire`](super::LockBuilder::acquire).
pub(super) async fn run(
    locks: Locks,
    key: Key,
    opts: LockOptions,
) -> std::result::Result<LeaseGuard, AcquireError> {
    opts.validate().map_err(AcquireError::Failed)?;
    let started = Instant::now();
    let metrics = locks.metrics.clone();
    if let Some(m) = &metrics {
        m.attempts.inc();
    }
    let result = run_inner(locks, key, opts, started).await;
    if let Some(m) = &metrics {
        m.acquire_seconds.observe(started.elapsed().as_secs_f64());
        match &result {
            Ok(_) => m.successes.inc(),
            Err(AcquireError::Held(_)) | Err(AcquireError::Failed(Error::Timeout { .. })) => {
                m.failures.with_label_values(&["contention"]).inc()
            }
            Err(AcquireError::Failed(_)) => m.failures.with_label_values(&["store_error"]).inc(),
        }
    }
    result
}

async fn run_inner(
    locks: Locks,
    key: Key,
    opts: LockOptions,
    started: Instant,
) -> std::result::Result<LeaseGuard, AcquireError> {
    let deadline = match opts.wait {
        Wait::No => Some(started),
        // A limit too far off for the clock to represent is no limit.
        Wait::For(d) => started.checked_add(d),
        Wait::Forever => None,
    };
    let waiting = opts.wait != Wait::No;
    let timeout = |holder: String| {
        AcquireError::Failed(Error::Timeout {
            key: key.to_string(),
            holder,
            waited: started.elapsed(),
        })
    };

    // Layer 1: queue behind this process's other tasks on the key.
    let local = match &locks.local {
        None => None,
        Some(l) if !waiting => Some(
            l.try_lock(key.as_str())
                .ok_or_else(|| AcquireError::Held("another task of this process".into()))?,
        ),
        Some(l) => match deadline {
            None => Some(l.lock(key.as_str()).await),
            Some(d) => match tokio::time::timeout_at(d, l.lock(key.as_str())).await {
                Ok(g) => Some(g),
                Err(_) => return Err(timeout("another task of this process".into())),
            },
        },
    };

    // A lease the previous local holder handed on: ours without a store call if it fits.
    let mut local = local;
    if let Some(mut carry) = local.as_mut().and_then(LocalGuard::take_carry) {
        if carry.fits(locks.holder.as_str(), &opts) && carry.confirm().await {
            tracing::debug!(key = %key, "lease taken over from a task of this process");
            return Ok(LeaseGuard::carried(
                carry,
                locks.metrics.clone(),
                local,
                locks.live.clone(),
            ));
        }
        carry.release().await;
    }

    let store = locks.store.clone();
    let mut req = AcquireRequest::new(key.clone(), locks.holder.as_str(), opts.ttl);
    req.labels = opts.labels.clone();
    if waiting && opts.register_waiter {
        req.waiter_ttl = Some(opts.waiter_lifetime());
    }
    // Subscribed to change notifications only once the key turns out to be held: a free key
    // costs no subscription (a round trip on Redis). The attempt after subscribing is made at
    // once, so no change between the first attempt and the subscription is missed.
    let mut watch: Option<Box<dyn crate::store::ChangeWatch>> = None;
    let mut subscribed = false;
    // Subscribing failed: when to try again (polling meanwhile).
    let mut resubscribe_at: Option<Instant> = None;
    let mut attempt = 0u32;
    let mut registered = false;
    // Our place in the key's line of waiters (0: next to be granted) and what it says of the
    // pace of handoffs, so that a waiter far back polls rarely and the next one promptly.
    let mut line = Line::default();
    // Who held the key at the last answer, for the timeout's message.
    let mut last_holder: Option<String> = None;
    // A waiting acquire's store calls end by its wait limit and allowance (not a try: its
    // one call has the store's own timeout).
    let attempt_limit = match opts.wait {
        Wait::For(_) => deadline.and_then(|d| d.checked_add(WAIT_ALLOWANCE)),
        Wait::No | Wait::Forever => None,
    };
    // If this future is dropped while registered as waiter, withdraw in the background.
    let mut on_cancel = WithdrawOnDrop {
        store: Some(store.clone()),
        key: key.clone(),
        token: req.token.clone(),
        armed: false,
    };
    loop {
        // One fence for us and one for each task of this process queued behind us: the lease
        // is handed down that line before it goes back to the store.
        req.fences = 1 + local
            .as_ref()
            .map_or(0, |l| l.waiting().min(MAX_BLOCK - 1) as u64);
        let sent = Instant::now();
        // While the call is in flight, a drop of this future leaves it to the attempt, which
        // finishes it in the background and undoes what it did.
        on_cancel.armed = false;
        let call = Attempt::start(&store, req, registered);
        let (sent_req, res) = match attempt_limit {
            None => call.answer().await,
            Some(limit) => match tokio::time::timeout_at(limit, call.answer()).await {
                Ok(answered) => answered,
                Err(_) => {
                    // Dropped unanswered: it finishes in the background, undoing what it did.
                    return Err(timeout(last_holder.unwrap_or_else(|| {
                        "unknown (the store did not answer within the wait limit)".into()
                    })));
                }
            },
        };
        req = sent_req;
        let failed = res.is_err();
        let (wait_hint, holder) = match res {
            Ok(AcquireOutcome::Granted(rec)) => {
                on_cancel.armed = false;
                tracing::debug!(key = %key, fence = rec.fence, "lease acquired");
                return Ok(LeaseGuard::new(Grant {
                    store,
                    record: rec,
                    key,
                    token: req.token,
                    opts,
                    sent_at: sent,
                    metrics: locks.metrics.clone(),
                    local,
                    live: locks.live.clone(),
                    fences: req.fences,
                }));
            }
            Ok(AcquireOutcome::Held(rec)) if !waiting => {
                return Err(AcquireError::Held(holder_of(&rec, now_ms())));
            }
            Ok(AcquireOutcome::Held(rec)) => {
                let place = crate::decide::position(&rec, &req.token);
                registered |= place.is_some();
                if line.seen(place, rec.token.as_deref(), sent.elapsed()) {
                    attempt = 0;
                }
                let now = now_ms();
                let who = holder_of(&rec, now);
                // Wake no later than the holder's expiry (+1 ms) to take over a dead lease
                // (unless others stand in line before us: the first of them takes it over).
                let hint = if rec.is_held(now) && place.unwrap_or(0) == 0 {
                    Some(rec.remaining(now) + Duration::from_millis(1))
                } else {
                    None
                };
                (hint, who)
            }
            Err(e) if waiting && e.is_retryable() => {
                tracing::debug!(key = %key, error = %e, "acquire failed; retrying");
                (None, format!("unknown (store error: {e})"))
            }
            Err(e) => {
                on_cancel.armed = false;
                let until = attempt_limit.unwrap_or_else(|| Instant::now() + WAIT_ALLOWANCE);
                withdraw_by(until, &store, &key, &req.token, registered).await;
                return Err(AcquireError::Failed(e));
            }
        };
        on_cancel.armed = registered;
        let now = Instant::now();
        if let Some(d) = deadline.filter(|&d| now >= d) {
            on_cancel.armed = false;
            withdraw_by(d + WAIT_ALLOWANCE, &store, &key, &req.token, registered).await;
            return Err(timeout(holder));
        }
        last_holder = Some(holder);
        if watch.as_ref().is_some_and(|w| w.stale()) {
            // Its connection ended or its server stopped answering (a failover whose old
            // server hangs): subscribe again, where the store now is.
            tracing::debug!(key = %key, "change notification lost; subscribing again");
            watch = None;
            subscribed = false;
            req.watching = false;
        }
        if !subscribed {
            subscribed = true;
            // Within the wait limit, whatever the store does.
            let subscribing = store.subscribe(&key);
            let answer = match deadline {
                Some(d) => tokio::time::timeout_at(d, subscribing).await.ok(),
                None => Some(subscribing.await),
            };
            watch = match answer {
                Some(Ok(w)) => w,
                Some(Err(e)) => {
                    tracing::debug!(key = %key, error = %e, "no change notification; polling, and subscribing again in a while");
                    resubscribe_at = Some(Instant::now() + RESUBSCRIBE_EVERY);
                    None
                }
                None => None,
            };
            req.watching = watch.is_some();
            if watch.is_some() {
                // Attempt again at once: a release between the last attempt and the
                // subscription was not heard. Without a subscription there is nothing to
                // miss, and the next attempt waits for the pause.
                continue;
            }
        }
        let mut pause = opts.backoff.delay(attempt);
        if watch.is_some() {
            // With notifications the timer is only a safety net.
            pause = opts.backoff.max;
        } else if let Some(behind) = line.behind_for() {
            // Nothing to win before the waiters ahead of us were served (see `Line`).
            pause = pause.max(behind);
        }
        if let Some(h) = wait_hint {
            pause = pause.min(h);
        }
        if req.waiter_ttl.is_some() {
            pause = pause.min(opts.waiter_lifetime() / 3);
        }
        if let Some(at) = resubscribe_at {
            pause = pause.min(at.saturating_duration_since(now));
        }
        if failed {
            // The store failed to answer (a failover under way, say): its state is unknown,
            // and a change notification that woke this attempt is spent. Attempt again soon,
            // whatever the backoff, rather than sleep a long one for a notification that may
            // have come already.
            pause = pause.min(RETRY_AFTER_ERROR);
        }
        tracing::trace!(key = %key, place = ?line.place.map(|p| p.0), per_handoff = ?line.per_handoff, ?pause, attempt, "waiting");
        let mut until = now + pause;
        if let Some(d) = deadline {
            until = until.min(d);
        }
        match watch.as_mut() {
            Some(w) => {
                tokio::select! {
                    _ = w.changed() => {}
                    _ = tokio::time::sleep_until(until) => { attempt = attempt.saturating_add(1); }
                }
            }
            None => {
                tokio::time::sleep_until(until).await;
                attempt = attempt.saturating_add(1);
            }
        }
        if resubscribe_at.is_some_and(|at| Instant::now() >= at) {
            resubscribe_at = None;
            subscribed = false;
        }
    }
}

/// What a waiting acquisition saw of its place in the key's line of waiters
/// ([`LeaseRecord::queue`](crate::record::LeaseRecord::queue)), on its monotonic clock.
///
/// The first in line looks promptly (by the backoff, started over whenever the lease changes
/// hands or it moves up): a released lease is reserved for it and idle until it looks. A waiter
/// further back cannot win before those ahead of it were served, so it sleeps for half the time
/// they need at the fastest pace the line has shown (or by the backoff, if longer, while the
/// line does not move): it looks about `log₂(place)` times while it moves up, not at every
/// handoff.
#[derive(Debug, Default)]
struct Line {
    /// The place last seen (0: next to be granted), and when.
    place: Option<(usize, Instant)>,
    /// The holder's token last seen while first in line.
    holder: Option<String>,
    /// The fastest time one handoff took as the line moved, let go of slowly.
    per_handoff: Option<Duration>,
    /// The least one handoff can take (two of the store's round trips, as last measured).
    least: Duration,
}

impl Line {
    /// Takes note of standing at `place` (`None`: not in line) while `holder` holds the lease,
    /// after an attempt that took `rtt`; true when the backoff should start over (we moved up,
    /// or the lease changed hands while we are first in line).
    fn seen(&mut self, place: Option<usize>, holder: Option<&str>, rtt: Duration) -> bool {
        let now = Instant::now();
        // A handoff takes at least a release and a grant: two round trips.
        self.least = rtt * 2;
        let moved = match (self.place, place) {
            (Some((was, at)), Some(p)) if p < was => {
                let took = now.saturating_duration_since(at) / (was - p) as u32;
                // The fastest pace seen, let go of slowly: sleeping on a pace too slow leaves
                // the lease idle once we are first (the line moves in bursts), which would
                // slow the pace more; the first measurement is bounded by a few round trips
                // for the same reason.
                self.per_handoff = Some(match self.per_handoff {
                    Some(d) => took.min(d + d / 16),
                    None => took.min(self.least * 4),
                });
                self.place = Some((p, now));
                true
            }
            (Some((was, _)), Some(p)) if p == was => false,
            (_, p) => {
                self.place = p.map(|p| (p, now));
                true
            }
        };
        if place != Some(0) {
            self.holder = None;
            return moved;
        }
        let changed = self.holder.as_deref() != holder;
        self.holder = holder.map(str::to_owned);
        moved || changed
    }

    /// How long to leave the store alone while the waiters ahead of us are served (see the
    /// type); `None` when first or out of line.
    fn behind_for(&self) -> Option<Duration> {
        let (p, _) = self.place?;
        let per = self.per_handoff.unwrap_or(self.least);
        (p > 0).then(|| per.mul_f64(p as f64 / 2.0))
    }
}

/// Who keeps a held record from us, for messages: its live holder, or the waiter it is reserved
/// for.
fn holder_of(rec: &crate::record::LeaseRecord, now_ms: u64) -> String {
    match (&rec.holder, rec.is_held(now_ms)) {
        (Some(h), true) => h.clone(),
        _ => format!(
            "nobody (reserved for waiter {})",
            rec.waiter.clone().unwrap_or_default()
        ),
    }
}

/// Withdraws a waiter registration when a waiting `acquire` is dropped (cancelled).
struct WithdrawOnDrop {
    store: Option<Arc<dyn LockStore>>,
    key: Key,
    token: String,
    armed: bool,
}

impl Drop for WithdrawOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Some(store) = self.store.take() {
            let (key, token) = (self.key.clone(), std::mem::take(&mut self.token));
            crate::background::spawn_here(
                async move { withdraw(&*store, &key, &token, true).await },
            );
        }
    }
}

/// The longest pause of a waiting `acquire` after an attempt that failed with a retryable error.
pub(super) const RETRY_AFTER_ERROR: Duration = Duration::from_secs(1);

/// How often a waiting `acquire` whose change notification could not be made (or made again,
/// after its connection ended) tries to subscribe again; it polls by its backoff meanwhile.
const RESUBSCRIBE_EVERY: Duration = Duration::from_secs(1);

/// How far past its wait limit a waiting `acquire` goes for the store's last answers (to its last
/// attempt, to the withdrawal of its waiter registration) before it returns and leaves them to
/// finish in the background.
const WAIT_ALLOWANCE: Duration = Duration::from_millis(100);

/// The answer of one store acquisition, with the store and request it was made with.
type Answered = (Arc<dyn LockStore>, AcquireRequest, Result<AcquireOutcome>);

/// One store acquisition in flight. Dropped before it answers (its caller's wait limit passed, or
/// the caller's future was dropped), the call goes on in the background, where a lease it granted
/// is released and a waiter registration (its own or an earlier attempt's, `registered`) is
/// withdrawn, so nothing stays taken for a caller that left. [`crate::settle`] waits for it.
struct Attempt {
    call: Pin<Box<dyn Future<Output = Answered> + Send>>,
    answered: bool,
    registered: bool,
    /// The request's flag, set when the attempt is dropped unanswered: a store retrying within
    /// the call (a lost compare-and-set race) stops instead of taking the key for nobody.
    given_up: GiveUp,
}

impl Attempt {
    fn start(store: &Arc<dyn LockStore>, req: AcquireRequest, registered: bool) -> Self {
        let store = store.clone();
        let given_up = req.given_up.clone();
        Attempt {
            given_up,
            call: Box::pin(async move {
                let res = store.acquire(&req).await;
                (store, req, res)
            }),
            answered: false,
            registered,
        }
    }

    /// The request back, and the store's answer. Cancel safe: a dropped wait drops the attempt,
    /// which leaves the call to the background.
    async fn answer(mut self) -> (AcquireRequest, Result<AcquireOutcome>) {
        let (_, req, res) = (&mut self.call).await;
        self.answered = true;
        (req, res)
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        self.given_up.give_up();
        // A zero-sized stand-in: no allocation.
        let call = std::mem::replace(&mut self.call, Box::pin(std::future::pending()));
        let registered = self.registered;
        crate::background::spawn_here(async move {
            let (store, req, res) = call.await;
            let (key, token) = (&req.key, req.token.as_str());
            match res {
                Ok(AcquireOutcome::Granted(_)) => {
                    tracing::debug!(key = %key, "releasing a lease granted to an acquisition that was given up");
                    if let Err(e) = store.release(key, token).await {
                        tracing::debug!(key = %key, error = %e, "could not release a lease granted to an acquisition that was given up; it expires with its TTL");
                    }
                }
                Ok(AcquireOutcome::Held(rec)) => {
                    let mine = crate::decide::position(&rec, token).is_some();
                    withdraw(&*store, key, token, registered || mine).await;
                }
                Err(_) => withdraw(&*store, key, token, registered).await,
            }
        });
    }
}

/// Withdraws a waiter registration, waiting for it until `until` at most (a slow store does not
/// stretch a wait limit): the withdrawal then goes on in the background.
async fn withdraw_by(
    until: Instant,
    store: &Arc<dyn LockStore>,
    key: &Key,
    token: &str,
    registered: bool,
) {
    if !registered {
        return;
    }
    let (store, key, token) = (store.clone(), key.clone(), token.to_owned());
    let (done, finished) = tokio::sync::oneshot::channel::<()>();
    crate::background::spawn_here(async move {
        withdraw(&*store, &key, &token, true).await;
        let _ = done.send(());
    });
    let _ = tokio::time::timeout_at(until, finished).await;
}

async fn withdraw(store: &dyn LockStore, key: &Key, token: &str, registered: bool) {
    if registered {
        if let Err(e) = store.withdraw_waiter(key, token).await {
            tracing::debug!(key = %key, error = %e, "could not withdraw waiter registration; it lapses");
        }
    }
}

pub(super) enum AcquireError {
    /// Held elsewhere; by whom.
    Held(String),
    Failed(Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A waiter far back sleeps for half the time those ahead of it need at the fastest pace
    /// seen; the first in line looks again promptly whenever the lease changes hands.
    #[tokio::test(start_paused = true)]
    async fn a_waiter_far_back_sleeps_by_its_place_and_the_first_looks_promptly() {
        let mut line = Line::default();
        // Just arrived at place 11; an attempt takes 5 ms, so a handoff at least 10.
        assert!(line.seen(Some(11), Some("h1"), 5 * MS));
        assert_eq!(line.behind_for(), Some(55 * MS));
        // 300 ms later, 3 places further: 100 ms a handoff, but the first measurement is
        // bounded by four times the least (40 ms).
        tokio::time::advance(300 * MS).await;
        assert!(line.seen(Some(8), Some("h2"), 5 * MS));
        assert_eq!(line.behind_for(), Some(160 * MS));
        // The line stands still: no start over, same sleep.
        assert!(!line.seen(Some(8), Some("h3"), 5 * MS));
        // A slower pace is followed by a sixteenth at a time.
        tokio::time::advance(800 * MS).await;
        assert!(line.seen(Some(4), Some("h4"), 5 * MS));
        assert_eq!(line.behind_for(), Some(85 * MS));
        // First in line: no sleep by place, and every change of holder starts the backoff over.
        assert!(line.seen(Some(0), Some("h5"), 5 * MS));
        assert_eq!(line.behind_for(), None);
        assert!(!line.seen(Some(0), Some("h5"), 5 * MS));
        assert!(line.seen(Some(0), None, 5 * MS));
        // Out of line (the line was full): the backoff alone.
        let mut out = Line::default();
        out.seen(None, Some("h"), 5 * MS);
        assert_eq!(out.behind_for(), None);
    }
}
