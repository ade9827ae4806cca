//! One acquisition: the local layer first, then store attempts until granted, refused or out of
//! time, waking on the store's change notification or a timer; what a caller that leaves early
//! leaves behind is undone in the background.

use super::line::Line;
use super::Locks;
use crate::error::{Error, Result};
use crate::guard::{Grant, LeaseGuard};
use crate::key::Key;
use crate::local::LocalGuard;
use crate::options::{LockOptions, Wait};
use crate::record::now_ms;
use crate::store::{AcquireOutcome, AcquireRequest, GiveUp, LockStore, PermitRequest};
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
    permit: Option<PermitRequest>,
) -> std::result::Result<LeaseGuard, AcquireError> {
    opts.validate().map_err(AcquireError::Failed)?;
    if let Some(p) = &permit {
        p.validate().map_err(AcquireError::Failed)?;
    }
    let started = Instant::now();
    let metrics = locks.metrics.clone();
    if let Some(m) = &metrics {
        m.attempts.inc();
    }
    let result = Acquisition::new(locks, key, opts, permit, started)
        .run()
        .await;
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

/// One acquisition, from its options to its end: what stays fixed while it waits.
struct Acquisition {
    locks: Locks,
    key: Key,
    opts: LockOptions,
    /// A permit of a semaphore or read-write lock instead of the key's lock: taken without the
    /// local layer (several tasks of this process may hold permits of one key).
    permit: Option<PermitRequest>,
    started: Instant,
    /// When the wait ends: `started` for a try, `None` for no limit.
    deadline: Option<Instant>,
    /// When a waiting acquire's store calls end: its wait limit and allowance (a try's one call
    /// has the store's own timeout).
    attempt_limit: Option<Instant>,
    /// Whether it waits at all (not a try).
    waiting: bool,
}

/// What a waiting acquisition learns and holds between its attempts.
struct Waiting {
    /// The attempts since the backoff last started over.
    attempt: u32,
    /// What it may have left in the store, to undo when it leaves without a lease.
    traces: Traces,
    /// Its place in the key's line of waiters (0: next to be granted) and what it says of the
    /// pace of handoffs, so that a waiter far back polls rarely and the next one promptly.
    line: Line,
    /// Who held the key at the last answer, for the timeout's message.
    last_holder: Option<String>,
    /// If the acquisition is dropped between attempts, undoes its traces in the background.
    on_cancel: WithdrawOnDrop,
    /// The change notification it sleeps on.
    changes: Changes,
}

/// What an acquisition may have left in the store, undone when it leaves without a lease.
#[derive(Debug, Clone, Copy, Default)]
struct Traces {
    /// It stands in the key's line of waiters: its place is withdrawn.
    registered: bool,
    /// An attempt of it went unanswered (a call that timed out, a connection that ended): the
    /// store may have granted it a lease nobody was told of, which is released (by its owner
    /// token: a release of nothing changes nothing).
    unanswered: bool,
}

impl Traces {
    fn any(self) -> bool {
        self.registered || self.unanswered
    }
}

/// What one attempt's answer leaves to do.
enum Answer {
    /// Granted: the record, and when the request was sent.
    Granted(crate::record::LeaseRecord),
    /// Still held (or the store failed, retryably): wake no later than `hint`; `holder` for
    /// messages; `failed` when the store did not answer.
    Wait {
        hint: Option<Duration>,
        holder: String,
        failed: bool,
    },
}

impl Acquisition {
    fn new(
        locks: Locks,
        key: Key,
        opts: LockOptions,
        permit: Option<PermitRequest>,
        started: Instant,
    ) -> Self {
        let deadline = match opts.wait {
            Wait::No => Some(started),
            // A limit too far off for the clock to represent is no limit.
            Wait::For(d) => started.checked_add(d),
            Wait::Forever => None,
        };
        let attempt_limit = match opts.wait {
            Wait::For(_) => deadline.and_then(|d| d.checked_add(WAIT_ALLOWANCE)),
            Wait::No | Wait::Forever => None,
        };
        Acquisition {
            waiting: opts.wait != Wait::No,
            locks,
            key,
            opts,
            permit,
            started,
            deadline,
            attempt_limit,
        }
    }

    fn timeout(&self, holder: String) -> AcquireError {
        AcquireError::Failed(Error::Timeout {
            key: self.key.to_string(),
            holder,
            waited: self.started.elapsed(),
        })
    }

    /// Layer 1: queues behind this process's other tasks on the key.
    async fn queue_locally(&self) -> std::result::Result<Option<LocalGuard>, AcquireError> {
        let key = self.key.as_str();
        Ok(match &self.locks.local {
            _ if self.permit.is_some() => None,
            None => None,
            Some(l) if !self.waiting => Some(
                l.try_lock(key)
                    .ok_or_else(|| AcquireError::Held("another task of this process".into()))?,
            ),
            Some(l) => match self.deadline {
                None => Some(l.lock(key).await),
                Some(d) => match tokio::time::timeout_at(d, l.lock(key)).await {
                    Ok(g) => Some(g),
                    Err(_) => return Err(self.timeout("another task of this process".into())),
                },
            },
        })
    }

    /// A lease the previous local holder handed on: ours without a store call if it fits;
    /// otherwise released, and the local slot given back.
    async fn carried(
        &self,
        mut local: Option<LocalGuard>,
    ) -> std::result::Result<LeaseGuard, Option<LocalGuard>> {
        let Some(mut carry) = local.as_mut().and_then(LocalGuard::take_carry) else {
            return Err(local);
        };
        if carry.fits(self.locks.holder.as_str(), &self.opts) && carry.confirm().await {
            tracing::debug!(key = %self.key, "lease taken over from a task of this process");
            return Ok(LeaseGuard::carried(
                carry,
                self.locks.metrics.clone(),
                local,
                self.locks.live.clone(),
            ));
        }
        carry.release().await;
        Err(local)
    }

    fn request(&self) -> AcquireRequest {
        let mut req =
            AcquireRequest::new(self.key.clone(), self.locks.holder.as_str(), self.opts.ttl);
        req.labels = self.opts.labels.clone();
        req.permit = self.permit;
        if self.waiting && self.opts.register_waiter {
            req.waiter_ttl = Some(self.opts.waiter_lifetime());
        }
        req
    }

    async fn run(self) -> std::result::Result<LeaseGuard, AcquireError> {
        let local = self.queue_locally().await?;
        let local = match self.carried(local).await {
            Ok(guard) => return Ok(guard),
            Err(local) => local,
        };
        let store = self.locks.store.clone();
        let mut req = self.request();
        let mut waiting = Waiting::new(&store, &req);
        loop {
            // One fence for us and one for each task of this process queued behind us: the
            // lease is handed down that line before it goes back to the store.
            req.fences = 1 + local
                .as_ref()
                .map_or(0, |l| l.waiting().min(MAX_BLOCK - 1) as u64);
            let sent = Instant::now();
            let (sent_req, res) = self.call(req, &mut waiting).await?;
            req = sent_req;
            let (hint, holder, failed) = match self.answer(res, &req, sent, &mut waiting).await? {
                Answer::Granted(record) => {
                    waiting.on_cancel.traces = Traces::default();
                    tracing::debug!(key = %self.key, fence = record.fence, "lease acquired");
                    return Ok(self.granted(store, record, req, sent, local));
                }
                Answer::Wait {
                    hint,
                    holder,
                    failed,
                } => (hint, holder, failed),
            };
            waiting.on_cancel.traces = waiting.traces;
            let now = Instant::now();
            if let Some(d) = self.deadline.filter(|&d| now >= d) {
                waiting.on_cancel.traces = Traces::default();
                withdraw_by(
                    d + WAIT_ALLOWANCE,
                    &store,
                    &self.key,
                    &req.token,
                    waiting.traces,
                )
                .await;
                return Err(self.timeout(holder));
            }
            waiting.last_holder = Some(holder);
            if waiting
                .changes
                .subscribe(&store, &self.key, &req.token, self.deadline)
                .await
            {
                req.watching = true;
                // Attempt again at once: a release between the last attempt and the
                // subscription was not heard. Without a subscription there is nothing to
                // miss, and the next attempt waits for the pause. A waiter in line whose
                // watch heard every change since the attempt was sent has missed nothing.
                let in_line = waiting.line.place.is_some();
                if !(in_line && waiting.changes.heard_since(sent)) {
                    continue;
                }
            }
            req.watching = waiting.changes.watch.is_some();
            let pause = self.pause(&waiting, &req, hint, failed, now);
            tracing::trace!(key = %self.key, place = ?waiting.line.place.map(|p| p.0), per_handoff = ?waiting.line.per_handoff, ?pause, attempt = waiting.attempt, "waiting");
            let mut until = now + pause;
            if let Some(d) = self.deadline {
                until = until.min(d);
            }
            // A waiter further back in line has nothing to win at the next change: it sleeps
            // through the changes that serve those ahead of it but one (each release moves
            // the line up by one), so a handoff wakes the first in line and the next, not
            // every waiter; for no longer than those ahead need (see `Line::skip`), and never
            // for less than the backoff.
            // A watch that wakes this waiter only for changes that may concern it (a grant to
            // another waiter does not) sleeps through none.
            let skip = match waiting.line.skip().filter(|_| !waiting.changes.targeted) {
                Some((n, at_most)) => {
                    let at_most = at_most.max(self.opts.backoff.delay(waiting.attempt));
                    until = until.min(now + at_most);
                    n
                }
                None => 0,
            };
            if waiting.changes.sleep_until(until, skip).await {
                waiting.attempt = waiting.attempt.saturating_add(1);
            }
        }
    }

    /// One store call, bounded by the attempt limit. While it is in flight, a drop of this
    /// future leaves it to the attempt, which finishes it in the background and undoes what it
    /// did.
    async fn call(
        &self,
        req: AcquireRequest,
        waiting: &mut Waiting,
    ) -> std::result::Result<(AcquireRequest, Result<AcquireOutcome>), AcquireError> {
        waiting.on_cancel.traces = Traces::default();
        let call = Attempt::start(&self.locks.store, req, waiting.traces);
        match self.attempt_limit {
            None => Ok(call.answer().await),
            Some(limit) => match tokio::time::timeout_at(limit, call.answer()).await {
                Ok(answered) => Ok(answered),
                // Dropped unanswered: it finishes in the background, undoing what it did.
                Err(_) => Err(self.timeout(waiting.last_holder.take().unwrap_or_else(|| {
                    "unknown (the store did not answer within the wait limit)".into()
                }))),
            },
        }
    }

    /// What the store's answer leaves to do: a grant, an end (held for a try, or an error that
    /// a retry cannot heal, after withdrawing), or a wait.
    async fn answer(
        &self,
        res: Result<AcquireOutcome>,
        req: &AcquireRequest,
        sent: Instant,
        waiting: &mut Waiting,
    ) -> std::result::Result<Answer, AcquireError> {
        match res {
            Ok(AcquireOutcome::Granted(record)) => Ok(Answer::Granted(record)),
            Ok(AcquireOutcome::Held(rec)) if !self.waiting => {
                Err(AcquireError::Held(holder_of(&rec, now_ms())))
            }
            Ok(AcquireOutcome::Held(rec)) => {
                let place = rec.place_of(&req.token);
                waiting.traces.registered |= place.is_some();
                waiting.line.permit_key = rec.permits.is_some();
                if waiting
                    .line
                    .seen(place, rec.token.as_deref(), sent.elapsed())
                {
                    waiting.attempt = 0;
                }
                let now = now_ms();
                // Wake no later than the holder's expiry (+1 ms) to take over a dead lease
                // (unless others stand in line before us: the first of them takes it over).
                let hint = (rec.is_held(now) && place.unwrap_or(0) == 0)
                    .then(|| rec.remaining(now) + Duration::from_millis(1));
                Ok(Answer::Wait {
                    hint,
                    holder: holder_of(&rec, now),
                    failed: false,
                })
            }
            Err(e) if self.waiting && e.is_retryable() => {
                tracing::debug!(key = %self.key, error = %e, "acquire failed; retrying");
                waiting.traces.unanswered = true;
                Ok(Answer::Wait {
                    hint: None,
                    holder: format!("unknown (store error: {e})"),
                    failed: true,
                })
            }
            Err(e) => {
                waiting.on_cancel.traces = Traces::default();
                waiting.traces.unanswered |= e.is_retryable();
                let until = self
                    .attempt_limit
                    .unwrap_or_else(|| Instant::now() + WAIT_ALLOWANCE);
                withdraw_by(
                    until,
                    &self.locks.store,
                    &self.key,
                    &req.token,
                    waiting.traces,
                )
                .await;
                Err(AcquireError::Failed(e))
            }
        }
    }

    /// How long to leave the store alone before the next attempt (the deadline aside).
    fn pause(
        &self,
        waiting: &Waiting,
        req: &AcquireRequest,
        hint: Option<Duration>,
        failed: bool,
        now: Instant,
    ) -> Duration {
        let backoff = &self.opts.backoff;
        let mut pause = backoff.delay(waiting.attempt);
        if waiting.changes.watch.is_some() {
            // With notifications the timer is only a safety net.
            pause = backoff.max;
        } else if let Some(behind) = waiting.line.behind_for() {
            // Nothing to win before the waiters ahead of us were served (see `Line`).
            pause = pause.max(behind);
        }
        if let Some(h) = hint {
            pause = pause.min(h);
        }
        if req.waiter_ttl.is_some() {
            pause = pause.min(self.opts.waiter_lifetime() / 3);
        }
        if let Some(at) = waiting.changes.resubscribe_at {
            pause = pause.min(at.saturating_duration_since(now));
        }
        if failed {
            // The store failed to answer (a failover under way, say): its state is unknown,
            // and a change notification that woke this attempt is spent. Attempt again soon,
            // whatever the backoff, rather than sleep a long one for a notification that may
            // have come already.
            pause = pause.min(RETRY_AFTER_ERROR);
        }
        pause
    }

    fn granted(
        self,
        store: Arc<dyn LockStore>,
        record: crate::record::LeaseRecord,
        req: AcquireRequest,
        sent: Instant,
        local: Option<LocalGuard>,
    ) -> LeaseGuard {
        LeaseGuard::new(Grant {
            store,
            record,
            key: self.key,
            token: req.token,
            opts: self.opts,
            sent_at: sent,
            metrics: self.locks.metrics.clone(),
            local,
            live: self.locks.live.clone(),
            fences: req.fences,
        })
    }
}

impl Waiting {
    fn new(store: &Arc<dyn LockStore>, req: &AcquireRequest) -> Self {
        Waiting {
            attempt: 0,
            traces: Traces::default(),
            line: Line::default(),
            last_holder: None,
            on_cancel: WithdrawOnDrop {
                store: Some(store.clone()),
                key: req.key.clone(),
                token: req.token.clone(),
                traces: Traces::default(),
                runtime: crate::background::here(),
            },
            changes: Changes::default(),
        }
    }
}

/// The store's change notification for the key, subscribed only once the key turns out to be
/// held: a free key costs no subscription (a round trip on Redis).
#[derive(Default)]
struct Changes {
    watch: Option<Box<dyn crate::store::ChangeWatch>>,
    subscribed: bool,
    /// The watch skips the changes that cannot concern this waiter
    /// ([`crate::store::ChangeWatch::for_waiter`]).
    targeted: bool,
    /// Subscribing failed: when to try again (polling meanwhile).
    resubscribe_at: Option<Instant>,
}

impl Changes {
    /// Subscribes when not subscribed (again, when the watch went stale or the time to retry
    /// came), within the wait limit whatever the store does; true when a new watch was made.
    async fn subscribe(
        &mut self,
        store: &Arc<dyn LockStore>,
        key: &Key,
        token: &str,
        deadline: Option<Instant>,
    ) -> bool {
        if self.watch.as_ref().is_some_and(|w| w.stale()) {
            // Its connection ended or its server stopped answering (a failover whose old
            // server hangs): subscribe again, where the store now is.
            tracing::debug!(key = %key, "change notification lost; subscribing again");
            self.watch = None;
            self.subscribed = false;
        }
        if self.subscribed {
            return false;
        }
        self.subscribed = true;
        let subscribing = store.subscribe(key);
        let answer = match deadline {
            Some(d) => tokio::time::timeout_at(d, subscribing).await.ok(),
            None => Some(subscribing.await),
        };
        self.targeted = false;
        self.watch = match answer {
            Some(Ok(mut w)) => {
                self.targeted = w.as_mut().is_some_and(|w| w.for_waiter(token));
                w
            }
            Some(Err(e)) => {
                tracing::debug!(key = %key, error = %e, "no change notification; polling, and subscribing again in a while");
                self.resubscribe_at = Some(Instant::now() + RESUBSCRIBE_EVERY);
                None
            }
            None => None,
        };
        self.watch.is_some()
    }

    /// Whether the targeted watch heard every change since `sent` (see
    /// [`crate::store::ChangeWatch::heard_since`]).
    fn heard_since(&mut self, sent: Instant) -> bool {
        self.targeted
            && self
                .watch
                .as_mut()
                .is_some_and(|w| w.heard_since(sent.into_std()))
    }

    /// Sleeps until `until` or the change after `skip` others; true when the timer ended the
    /// sleep.
    async fn sleep_until(&mut self, until: Instant, mut skip: usize) -> bool {
        let timed_out = match self.watch.as_mut() {
            Some(w) => loop {
                tokio::select! {
                    _ = w.changed() => {
                        if skip == 0 || w.stale() {
                            break false;
                        }
                        skip -= 1;
                    }
                    _ = tokio::time::sleep_until(until) => break true,
                }
            },
            None => {
                tokio::time::sleep_until(until).await;
                true
            }
        };
        if self.resubscribe_at.is_some_and(|at| Instant::now() >= at) {
            self.resubscribe_at = None;
            self.subscribed = false;
        }
        timed_out
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

/// Undoes what a waiting `acquire` left in the store (its `traces`) when it is dropped
/// (cancelled) between attempts, on the runtime it was dropped in, else on the one it was made
/// under (dropped on a plain thread).
struct WithdrawOnDrop {
    store: Option<Arc<dyn LockStore>>,
    key: Key,
    token: String,
    traces: Traces,
    runtime: Option<tokio::runtime::Handle>,
}

impl Drop for WithdrawOnDrop {
    fn drop(&mut self) {
        if !self.traces.any() {
            return;
        }
        if let Some(store) = self.store.take() {
            let (key, token) = (self.key.clone(), std::mem::take(&mut self.token));
            let traces = self.traces;
            crate::background::spawn_on(self.runtime.as_ref(), async move {
                withdraw(&*store, &key, &token, traces).await
            });
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
/// is released, a waiter registration (its own or an earlier attempt's, `traces`) withdrawn, and
/// what an unanswered attempt may have been granted released, so nothing stays taken for a
/// caller that left; dropped outside any runtime (a blocking call interrupted on a plain
/// thread), it finishes on the runtime it was started under. [`crate::settle`] waits for it.
struct Attempt {
    call: Pin<Box<dyn Future<Output = Answered> + Send>>,
    answered: bool,
    traces: Traces,
    /// The request's flag, set when the attempt is dropped unanswered: a store retrying within
    /// the call (a lost compare-and-set race) stops instead of taking the key for nobody.
    given_up: GiveUp,
    /// The runtime it was started under, to finish on when dropped outside one.
    runtime: Option<tokio::runtime::Handle>,
}

impl Attempt {
    fn start(store: &Arc<dyn LockStore>, req: AcquireRequest, traces: Traces) -> Self {
        let store = store.clone();
        let given_up = req.given_up.clone();
        Attempt {
            given_up,
            call: Box::pin(async move {
                let res = store.acquire(&req).await;
                (store, req, res)
            }),
            answered: false,
            traces,
            runtime: crate::background::here(),
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
        let traces = self.traces;
        crate::background::spawn_on(self.runtime.as_ref(), async move {
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
                    let mine = rec.place_of(token).is_some();
                    let traces = Traces {
                        registered: traces.registered || mine,
                        ..traces
                    };
                    withdraw(&*store, key, token, traces).await;
                }
                Err(e) => {
                    let traces = Traces {
                        unanswered: traces.unanswered || e.is_retryable(),
                        ..traces
                    };
                    withdraw(&*store, key, token, traces).await
                }
            }
        });
    }
}

/// Undoes what an acquisition left in the store (see [`withdraw`]), waiting for it until `until`
/// at most (a slow store does not stretch a wait limit): it then goes on in the background.
async fn withdraw_by(
    until: Instant,
    store: &Arc<dyn LockStore>,
    key: &Key,
    token: &str,
    traces: Traces,
) {
    if !traces.any() {
        return;
    }
    let (store, key, token) = (store.clone(), key.clone(), token.to_owned());
    let (done, finished) = tokio::sync::oneshot::channel::<()>();
    crate::background::spawn_on(None, async move {
        withdraw(&*store, &key, &token, traces).await;
        let _ = done.send(());
    });
    let _ = tokio::time::timeout_at(until, finished).await;
}

/// Undoes what an acquisition that leaves without a lease left in the store: a grant made for
/// an attempt whose answer never came is released, and its place in line withdrawn.
async fn withdraw(store: &dyn LockStore, key: &Key, token: &str, traces: Traces) {
    if traces.unanswered {
        match store.release(key, token).await {
            Ok(crate::store::ReleaseOutcome::Released) => {
                tracing::debug!(key = %key, "released a grant whose answer was lost, for an acquisition that left");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(key = %key, error = %e, "could not release what an unanswered attempt may have been granted; it expires with its TTL");
            }
        }
    }
    if traces.registered {
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
