//! The renewal wheel: one scheduler per [`crate::Locks`] that starts each guard's renewal when it
//! comes due, the renewal itself (retried while the lease is surely valid), and the grid renewal
//! times are aligned to so that leases with the same period come due together.

use super::Shared;
use crate::record::now_ms;
use crate::store::{LostReason, RenewOutcome};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::Instrument;

/// One renewal scheduler per [`crate::Locks`]: a map of due times and one task that sleeps until
/// the earliest and starts each renewal that came due. A guard costs a map insert and remove, not
/// a task of its own (spawning and aborting one per lease cost more than a Redis round trip).
#[derive(Debug, Default)]
pub(super) struct Renewals {
    state: Mutex<Schedule>,
    wake: Arc<Notify>,
}

#[derive(Debug, Default)]
struct Schedule {
    due: BTreeMap<(Instant, u64), Weak<Shared>>,
    /// The scheduler task looks at this time or before (`None`: parked until woken, or not
    /// started); a guard due earlier wakes it.
    next_look: Option<Instant>,
    started: bool,
}

impl Renewals {
    /// Schedules `shared`'s next renewal at `at`.
    pub(super) fn schedule(self: &Arc<Self>, at: Instant, shared: &Arc<Shared>) {
        let wake = {
            let mut s = self.state.lock();
            if shared.state.borrow().released {
                return;
            }
            s.due.insert((at, shared.id), Arc::downgrade(shared));
            *shared.scheduled.lock() = Some(at);
            if !s.started {
                s.started = true;
                s.next_look = Some(at);
                tokio::spawn(run_schedule(Arc::downgrade(self), self.wake.clone()));
                false
            } else if s.next_look.is_some_and(|t| at >= t) {
                false
            } else {
                // The scheduler looks by `at` now; later schedules need not wake it again.
                s.next_look = Some(at);
                true
            }
        };
        if wake {
            self.wake.notify_one();
        }
    }

    pub(super) fn cancel(&self, shared: &Shared) {
        let at = shared.scheduled.lock().take();
        if let Some(at) = at {
            self.state.lock().due.remove(&(at, shared.id));
        }
    }
}

impl Drop for Renewals {
    fn drop(&mut self) {
        // Lets the scheduler task see that its `Locks` and all its guards are gone.
        self.wake.notify_one();
    }
}

/// The scheduler task of one [`Renewals`]; ends when its `Locks` and all its guards are gone.
async fn run_schedule(renewals: Weak<Renewals>, wake: Arc<Notify>) {
    loop {
        let next = {
            let Some(this) = renewals.upgrade() else {
                return;
            };
            let now = Instant::now();
            let mut ready = vec![];
            let next = {
                let mut s = this.state.lock();
                while let Some(entry) = s.due.first_entry() {
                    if entry.key().0 > now {
                        break;
                    }
                    ready.push(entry.remove());
                }
                // With nothing due (the guard that woke us already released), keep the time we
                // were woken for: the next guard, most likely due at the same point of the grid,
                // then finds us awake until then instead of waking us (a thread wake per
                // acquisition at low concurrency).
                let next = s
                    .due
                    .keys()
                    .next()
                    .map(|k| k.0)
                    .or(s.next_look.filter(|t| *t > now));
                s.next_look = next;
                next
            };
            for shared in ready.iter().filter_map(Weak::upgrade) {
                *shared.scheduled.lock() = None;
                let span = tracing::debug_span!("leasehold.renewer", key = %shared.key);
                let task = tokio::spawn(renew_round(shared.clone()).instrument(span));
                *shared.renewer.lock() = Some(task.abort_handle());
            }
            next
        };
        match next {
            Some(t) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(t) => {}
                    _ = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
    }
}

/// One renewal, retried while the lease is surely valid; schedules the next one on success.
async fn renew_round(shared: Arc<Shared>) {
    let period = shared.opts.renew_period();
    let ttl = shared.opts.ttl;
    let drift = shared.opts.drift();
    let mut attempt = 0u32;
    loop {
        let (valid_until, released) = {
            let s = shared.state.borrow();
            (s.valid_until, s.released)
        };
        if released {
            return;
        }
        if Instant::now() >= valid_until {
            shared.mark_lost(LostReason::Unreachable {
                detail: "renewal did not succeed before expiry".into(),
            });
            return;
        }
        let sent = Instant::now();
        let call = shared.store.renew(&shared.key, &shared.token, ttl);
        match tokio::time::timeout_at(valid_until, call).await {
            Ok(Ok(RenewOutcome::Renewed(rec))) => {
                if let Some(m) = &shared.metrics {
                    m.renewals.inc();
                }
                let waiter = (rec.has_live_waiter(now_ms())
                    && rec.waiter_token.as_deref() != Some(shared.token.as_str()))
                .then(|| rec.waiter.clone().unwrap_or_default());
                let mut raised = false;
                shared.state.send_if_modified(|s| {
                    s.valid_until = sent + ttl.saturating_sub(drift);
                    if s.handoff.is_none() && waiter.is_some() {
                        s.handoff = waiter.clone();
                        raised = true;
                    }
                    true
                });
                if raised {
                    if let Some(m) = &shared.metrics {
                        m.handoffs.inc();
                    }
                }
                shared
                    .renewals
                    .schedule(aligned(sent + period, period), &shared);
                return;
            }
            Ok(Ok(RenewOutcome::Lost(reason))) => {
                shared.mark_lost(reason);
                return;
            }
            Ok(Err(e)) if e.is_retryable() => {
                tracing::debug!(key = %shared.key, error = %e, "renewal failed; retrying");
                let left = valid_until.saturating_duration_since(Instant::now());
                let pause = shared.opts.backoff.delay(attempt).min(left / 4);
                attempt += 1;
                tokio::time::sleep(pause).await;
            }
            Ok(Err(e)) => {
                shared.mark_lost(LostReason::Unreachable {
                    detail: e.to_string(),
                });
                return;
            }
            Err(_) => {
                shared.mark_lost(LostReason::Unreachable {
                    detail: "renewal did not answer before expiry".into(),
                });
                return;
            }
        }
    }
}

/// Moves a renewal time earlier (by less than a quarter period) onto a grid shared by every guard
/// of the process, so leases with the same period come due together and stores that batch
/// renewals (Redis) renew them in one call. Renewing early is always safe.
pub(super) fn aligned(due: Instant, period: std::time::Duration) -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    let step = (period / 4).as_nanos().max(1);
    let since = due.saturating_duration_since(epoch).as_nanos();
    let back = since % step;
    due - std::time::Duration::from_nanos(back as u64)
}
