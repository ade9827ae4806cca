//! Lease options and the backoff policy.

use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::time::Duration;

/// How long `acquire` waits for a held lease. `try_acquire` never waits, whatever the policy.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use leasehold::{memory::MemoryStore, Error, HolderId, Locks, Wait};
/// let store = std::sync::Arc::new(MemoryStore::new());
/// let a = Locks::from_arc(store.clone()).with_holder(HolderId::new("a"));
/// let b = Locks::from_arc(store).with_holder(HolderId::new("b"));
/// let held = a.lock("k")?.acquire().await?;
/// // `Wait::No`: a held lease fails at once, naming its holder.
/// match b.lock("k")?.wait_policy(Wait::No).acquire().await {
///     Err(Error::Timeout { holder, .. }) => assert_eq!(holder, "a"),
///     other => panic!("{other:?}"),
/// }
/// # held.release().await?; Ok::<(), leasehold::Error>(()) }).unwrap();
/// ```
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
    /// The `n`th delay (from 0), jittered uniformly in [d/2, d], where d is `initial · 2ⁿ` capped at
    /// `max` (and at `initial · 2²⁰`).
    ///
    /// ```
    /// use leasehold::Backoff;
    /// use std::time::Duration;
    /// let b = Backoff::default(); // 5 ms doubling up to 500 ms
    /// let ms = Duration::from_micros;
    /// assert!((ms(2_500)..=ms(5_000)).contains(&b.delay(0)));
    /// assert!((ms(5_000)..=ms(10_000)).contains(&b.delay(1)));
    /// assert!((ms(250_000)..=ms(500_000)).contains(&b.delay(100)), "capped at max");
    /// ```
    pub fn delay(&self, n: u32) -> Duration {
        let base = self.initial.saturating_mul(1u32 << n.min(20)).min(self.max);
        let nanos = base.as_nanos() as u64;
        Duration::from_nanos(nanos / 2 + fastrand::u64(0..=nanos / 2))
    }
}

/// Options of one lock; every default is stated. Set them per lock with [`LockBuilder`]'s
/// setters, or for every lock with [`Locks::with_defaults`]. They are checked
/// ([`validate`](Self::validate)) when a lock is acquired, not when they are set.
///
/// [`LockBuilder`]: crate::LockBuilder
/// [`Locks::with_defaults`]: crate::Locks::with_defaults
///
/// ```
/// use leasehold::{LockOptions, Wait};
/// use std::time::Duration;
/// let mut o = LockOptions::default();
/// assert_eq!((o.ttl, o.wait, o.auto_renew), (Duration::from_secs(30), Wait::Forever, true));
/// assert_eq!(o.renew_period(), Duration::from_secs(10)); // ttl / 3
/// assert_eq!(o.waiter_lifetime(), Duration::from_secs(5)); // min(ttl, 5 s)
/// assert_eq!(o.drift(), Duration::from_millis(302)); // 1 % of ttl + 2 ms
/// // min(ttl / 3, (ttl − renew period − drift) / 2)
/// assert_eq!(o.loss_grace_period(), Duration::from_millis(9_849));
/// o.ttl = Duration::from_secs(2);
/// assert_eq!(o.waiter_lifetime(), Duration::from_secs(2));
/// assert_eq!(o.loss_grace_period().as_millis(), 655);
/// // renew period + loss grace + drift < ttl, for every TTL and renewal period that validate
/// assert!(o.renew_period() + o.loss_grace_period() + o.drift() < o.ttl);
/// ```
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
    /// The loss grace: how long before the lease could expire (its `valid_until`) the guard's
    /// [`must_stop`](crate::LeaseGuard::must_stop) fires when renewals have not succeeded, so
    /// that whatever acts under the lease can stop within it (default
    /// [`loss_grace_period`](Self::loss_grace_period)'s rule). Must satisfy
    /// `renew period + loss grace + drift < ttl`, so that at least one renewal is attempted
    /// before the holder is told to stop ([`max_loss_grace`](Self::max_loss_grace)).
    pub loss_grace: Option<Duration>,
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
            loss_grace: None,
        }
    }
}

impl LockOptions {
    /// The renewal period in effect: `renew_every`, else `ttl / 3` (see the type's example).
    pub fn renew_period(&self) -> Duration {
        self.renew_every.unwrap_or(self.ttl / 3)
    }

    /// The waiter registration lifetime in effect: `waiter_ttl`, else `min(ttl, 5 s)` (see the
    /// type's example).
    pub fn waiter_lifetime(&self) -> Duration {
        self.waiter_ttl
            .unwrap_or_else(|| self.ttl.min(Duration::from_secs(5)))
    }

    /// The safety margin before expiry at which a holder that could not renew gives up: 1 % of the
    /// TTL plus 2 ms (the Redlock drift rule).
    pub fn drift(&self) -> Duration {
        drift(self.ttl)
    }

    /// The loss grace in effect: `loss_grace`, else `min(ttl / 3, (ttl − renew period − drift) / 2)`
    /// — half the time between the first renewal and the lease's end, at most a third of the TTL
    /// (9.849 s at a 30 s TTL, 655 ms at 2 s; see the type's example). The default always
    /// satisfies `renew period + loss grace + drift < ttl` when the renewal period validates.
    pub fn loss_grace_period(&self) -> Duration {
        self.loss_grace.unwrap_or_else(|| {
            let left = self
                .ttl
                .saturating_sub(self.renew_period())
                .saturating_sub(self.drift());
            (self.ttl / 3).min(left / 2)
        })
    }

    /// The largest loss grace that fits these options (to the millisecond): the TTL less the
    /// renewal period, the [drift](Self::drift) margin and 1 ms; zero if none fits.
    ///
    /// ```
    /// use leasehold::LockOptions;
    /// use std::time::Duration;
    /// let o = LockOptions::default(); // ttl 30 s, renewed every 10 s, drift 302 ms
    /// assert_eq!(o.max_loss_grace(), Duration::from_millis(19_697));
    /// ```
    pub fn max_loss_grace(&self) -> Duration {
        let left = self
            .ttl
            .saturating_sub(self.renew_period())
            .saturating_sub(self.drift())
            .saturating_sub(Duration::from_millis(1));
        Duration::from_millis(crate::record::ms(left))
    }

    /// Checks that the options can work: a TTL from 10 ms to one year, a renewal period above
    /// zero that leaves the [drift](Self::drift) margin before the TTL, a loss grace with
    /// `renew period + loss grace + drift < ttl`, a backoff with `0 < initial ≤ max`, and a
    /// waiter lifetime of at least 10 ms.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] naming the option.
    ///
    /// ```
    /// use leasehold::{Error, LockOptions};
    /// use std::time::Duration;
    /// let name = |o: LockOptions| match o.validate() {
    ///     Err(Error::InvalidOption { name, .. }) => name,
    ///     other => panic!("{other:?}"),
    /// };
    /// assert!(LockOptions::default().validate().is_ok());
    /// let mut o = LockOptions::default();
    /// o.ttl = Duration::from_millis(5);
    /// assert_eq!(name(o), "ttl");
    /// let mut o = LockOptions::default();
    /// o.renew_every = Some(o.ttl); // no time left to renew before expiry
    /// assert_eq!(name(o), "renew_every");
    /// let mut o = LockOptions::default();
    /// o.waiter_ttl = Some(Duration::from_millis(1));
    /// assert_eq!(name(o), "waiter_ttl");
    /// let mut o = LockOptions::default();
    /// o.loss_grace = Some(Duration::from_secs(20)); // no renewal before the holder must stop
    /// assert_eq!(name(o), "loss_grace");
    /// // Durations past what a clock can add are refused, never a panic.
    /// let mut o = LockOptions::default();
    /// o.loss_grace = Some(Duration::MAX);
    /// assert_eq!(name(o), "loss_grace");
    /// let mut o = LockOptions::default();
    /// o.renew_every = Some(Duration::MAX);
    /// assert_eq!(name(o), "renew_every");
    /// let mut o = LockOptions::default();
    /// o.waiter_ttl = Some(Duration::MAX);
    /// assert_eq!(name(o), "waiter_ttl");
    /// ```
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
        if p.is_zero() || p.saturating_add(self.drift()) >= self.ttl {
            return Err(Error::option(
                "renew_every",
                format!(
                    "{p:?} must be above zero and leave room before the {:?} TTL",
                    self.ttl
                ),
            ));
        }
        if let Some(g) = self.loss_grace {
            if p.saturating_add(g).saturating_add(self.drift()) >= self.ttl {
                return Err(Error::option(
                    "loss_grace",
                    format!(
                        "{g:?} does not fit a {:?} TTL renewed every {p:?} (renew period + loss \
                         grace + drift must stay below the TTL): at most {:?}",
                        self.ttl,
                        self.max_loss_grace()
                    ),
                ));
            }
        }
        if self.backoff.initial.is_zero() || self.backoff.max < self.backoff.initial {
            return Err(Error::option("backoff", "initial must be > 0 and ≤ max"));
        }
        if self.waiter_lifetime() < Duration::from_millis(10) {
            return Err(Error::option("waiter_ttl", "must be at least 10 ms"));
        }
        if self.waiter_lifetime() > Duration::from_secs(365 * 24 * 3600) {
            return Err(Error::option("waiter_ttl", "must be at most one year"));
        }
        Ok(())
    }
}

/// The Redlock drift rule for a lease of `ttl`: 1 % of it plus 2 ms.
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// The default largest difference between two machines' wall clocks that the adapter assumes
/// (see the [adapter](crate::adapter)): five minutes.
pub const DEFAULT_MAX_CLOCK_SKEW: Duration = Duration::from_secs(300);
