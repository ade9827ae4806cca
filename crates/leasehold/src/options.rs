//! Lease options and the backoff policy.

use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::time::Duration;

/// How long `acquire` waits for a held lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Do not wait: held elsewhere is answered at once.
    No,
    /// Wait up to this long, then fail with [`Error::Timeout`].
    For(Duration),
    /// Wait until the lease is ours (or the future is dropped).
    Forever,
}

/// Capped exponential backoff with full jitter, used between attempts when the store has no
/// change notification (and as a safety net when it has).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// First delay (default 5 ms).
    pub initial: Duration,
    /// Largest delay (default 500 ms).
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(500),
        }
    }
}

impl Backoff {
    /// The `n`th delay (from 0), jittered uniformly in [d/2, d].
    pub fn delay(&self, n: u32) -> Duration {
        let base = self.initial.saturating_mul(1u32 << n.min(20)).min(self.max);
        let nanos = base.as_nanos() as u64;
        Duration::from_nanos(nanos / 2 + fastrand::u64(0..=nanos / 2))
    }
}

/// Options of one lock; every default is stated.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockOptions {
    /// Time to live of the lease (default 30 s). A holder that stops renewing loses it after this.
    pub ttl: Duration,
    /// Renewal period (default `ttl / 3`); also the period of the handoff check.
    pub renew_every: Option<Duration>,
    /// Whether the guard renews the lease by itself (default true).
    pub auto_renew: bool,
    /// How long `acquire` waits (default [`Wait::Forever`]).
    pub wait: Wait,
    /// Backoff between attempts while waiting.
    pub backoff: Backoff,
    /// Whether a waiting `acquire` registers as waiter so the holder's `handoff_requested()` fires
    /// and the freed lease is reserved for it (default true).
    pub register_waiter: bool,
    /// How long a waiter registration lives unless refreshed (default `min(ttl, 5 s)`).
    pub waiter_ttl: Option<Duration>,
    /// Labels stored with the lease.
    pub labels: BTreeMap<String, String>,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: Duration::from_secs(30),
            renew_every: None,
            auto_renew: true,
            wait: Wait::Forever,
            backoff: Backoff::default(),
            register_waiter: true,
            waiter_ttl: None,
            labels: BTreeMap::new(),
        }
    }
}

impl LockOptions {
    /// The renewal period in effect.
    pub fn renew_period(&self) -> Duration {
        self.renew_every.unwrap_or(self.ttl / 3)
    }

    /// The waiter registration lifetime in effect.
    pub fn waiter_lifetime(&self) -> Duration {
        self.waiter_ttl
            .unwrap_or_else(|| self.ttl.min(Duration::from_secs(5)))
    }

    /// The safety margin before expiry at which a holder that could not renew gives up: 1 % of the
    /// TTL plus 2 ms (the Redlock drift rule).
    pub fn drift(&self) -> Duration {
        drift(self.ttl)
    }

    /// Checks that the options can work.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] naming the option.
    pub fn validate(&self) -> Result<()> {
        if self.ttl < Duration::from_millis(10) {
            return Err(Error::option(
                "ttl",
                format!("{:?} is below the 10 ms minimum", self.ttl),
            ));
        }
        if self.ttl > Duration::from_secs(365 * 24 * 3600) {
            return Err(Error::option(
                "ttl",
                format!("{:?} is above one year", self.ttl),
            ));
        }
        let p = self.renew_period();
        if p.is_zero() || p + self.drift() >= self.ttl {
            return Err(Error::option(
                "renew_every",
                format!(
                    "{p:?} must be above zero and leave room before the {:?} TTL",
                    self.ttl
                ),
            ));
        }
        if self.backoff.initial.is_zero() || self.backoff.max < self.backoff.initial {
            return Err(Error::option("backoff", "initial must be > 0 and ≤ max"));
        }
        if self.waiter_lifetime() < Duration::from_millis(10) {
            return Err(Error::option("waiter_ttl", "must be at least 10 ms"));
        }
        Ok(())
    }
}

/// The Redlock drift rule for a lease of `ttl`: 1 % of it plus 2 ms.
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}
