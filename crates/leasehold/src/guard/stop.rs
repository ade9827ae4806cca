//! The stop-by signal of a held lease: when its holder must start stopping, early enough to be
//! done before the lease could expire, and the time up to which the lease is surely valid.
//!
//! ```text
//! sent ─ granted ─ renew ─ renew ✗ ─ … ─ stop-by ─────────────── valid_until ─ drift ─ another may be granted
//!                                         │◄──── loss grace ────►│
//! valid_until = sent(last successful renewal) + ttl − drift      (local monotonic clock)
//! stop-by     = valid_until − loss grace                          (must_stop() fires)
//! ```

use super::LeaseGuard;
use crate::store::LostReason;
use std::fmt;
use tokio::time::Instant;

/// Why the holder of a lease must stop now ([`LeaseGuard::must_stop`]).
///
/// ```
/// use leasehold::{LostReason, StopReason};
/// let gone = StopReason::Lost(LostReason::Released);
/// assert!(gone.is_gone());
/// assert_eq!(gone.to_string(), "lease lost: released by someone else (force-release or deletion)");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopReason {
    /// Renewals have not succeeded and only the loss grace is left before the lease could expire
    /// at `valid_until` (on this process's monotonic clock): stop within it.
    RenewalsFailing {
        /// The lease is surely valid until then, and not after.
        valid_until: Instant,
    },
    /// The lease is lost ([`LeaseGuard::lost`] completed with this reason).
    Lost(LostReason),
}

impl StopReason {
    /// Whether the store said the lease is gone ([`LostReason::is_gone`]): another holder may
    /// hold it already, so stop at once.
    pub fn is_gone(&self) -> bool {
        matches!(self, StopReason::Lost(r) if r.is_gone())
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::RenewalsFailing { valid_until } => write!(
                f,
                "renewals failing; the lease may expire in {:?}",
                valid_until.saturating_duration_since(Instant::now())
            ),
            StopReason::Lost(r) => write!(f, "lease lost: {r}"),
        }
    }
}

impl LeaseGuard {
    /// The time up to which the lease is surely ours, on this process's monotonic clock: when
    /// the last successful grant or renewal was *sent*, plus the TTL, less the drift margin.
    /// Moves forward with each renewal; says nothing once the lease is lost or released (see
    /// [`is_current`](Self::is_current)).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use std::time::Duration;
    /// let locks = leasehold::Locks::new(leasehold::stores::memory::MemoryStore::new());
    /// let guard = locks.lock("k")?.ttl(Duration::from_secs(2)).try_acquire().await?.expect("free");
    /// let left = guard.valid_until() - tokio::time::Instant::now();
    /// assert!(left <= Duration::from_millis(2_000 - 22), "ttl less 1 % + 2 ms");
    /// # guard.release().await?; Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn valid_until(&self) -> Instant {
        self.shared.state.borrow().valid_until
    }

    /// The stop-by deadline: [`valid_until`](Self::valid_until) less the loss grace
    /// ([`LockOptions::loss_grace_period`](crate::LockOptions::loss_grace_period)). Unless a
    /// renewal moves it, [`must_stop`](Self::must_stop) fires then.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use std::time::Duration;
    /// let locks = leasehold::Locks::new(leasehold::stores::memory::MemoryStore::new());
    /// let guard = locks.lock("k")?.ttl(Duration::from_secs(30))
    ///     .loss_grace(Duration::from_secs(5)).try_acquire().await?.expect("free");
    /// assert_eq!(guard.valid_until() - guard.stop_by(), Duration::from_secs(5));
    /// # guard.release().await?; Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn stop_by(&self) -> Instant {
        self.valid_until() - self.shared.opts.loss_grace_period()
    }

    /// Whether the holder must stop now: the lease is lost, or the stop-by deadline has passed
    /// without a renewal moving it. The non-waiting form of [`must_stop`](Self::must_stop);
    /// `false` once released. A renewal that succeeds after the deadline makes it `false` again.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let locks = leasehold::Locks::new(leasehold::stores::memory::MemoryStore::new());
    /// let guard = locks.lock("k")?.try_acquire().await?.expect("free");
    /// assert!(!guard.is_stop_due());
    /// # guard.release().await?; Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn is_stop_due(&self) -> bool {
        self.stop_due().is_some()
    }

    fn stop_due(&self) -> Option<StopReason> {
        let s = self.shared.state.borrow();
        if s.released {
            return None;
        }
        if let Some(r) = &s.lost {
            return Some(StopReason::Lost(r.clone()));
        }
        let stop_by = s.valid_until - self.shared.opts.loss_grace_period();
        (Instant::now() >= stop_by).then_some(StopReason::RenewalsFailing {
            valid_until: s.valid_until,
        })
    }

    /// Completes when whatever acts under the lease must start stopping, to be done before the
    /// lease could expire — client-go's renew deadline:
    /// - at the stop-by deadline ([`stop_by`](Self::stop_by): `valid_until − loss grace`) when
    ///   renewals have not moved it, with [`StopReason::RenewalsFailing`]: the lease is still
    ///   ours until `valid_until`, so a command may get SIGTERM now and SIGKILL before then;
    /// - at once when the lease is lost, with [`StopReason::Lost`]: when the store said it is
    ///   gone ([`StopReason::is_gone`]) another holder may already hold it.
    ///
    /// [`lost`](Self::lost) still fires later, at the last moment (`valid_until`). Never
    /// completes after `release`. Once due it stays due, and this completes at once, until a
    /// renewal succeeds again.
    ///
    /// # Cancel safety
    /// Cancel safe; call it again to wait again.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::{stores::memory::MemoryStore, Locks, StopReason};
    /// let locks = Locks::new(MemoryStore::new());
    /// let guard = locks.lock("job")?.try_acquire().await?.expect("free");
    /// tokio::select! {
    ///     why = guard.must_stop() => {
    ///         // Stop the work: at once if `why.is_gone()`, else before `guard.valid_until()`.
    ///         let _: StopReason = why;
    ///     }
    ///     _ = tokio::time::sleep(std::time::Duration::from_millis(5)) => { /* work done */ }
    /// }
    /// guard.release().await?;
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub async fn must_stop(&self) -> StopReason {
        loop {
            let changed = self.shared.state.changed();
            if let Some(why) = self.stop_due() {
                return why;
            }
            let deadline = {
                let s = self.shared.state.borrow();
                (!s.released).then(|| s.valid_until - self.shared.opts.loss_grace_period())
            };
            match deadline {
                Some(d) => {
                    let _ = tokio::time::timeout_at(d, changed).await;
                }
                None => changed.await,
            }
        }
    }

    /// Completes with the new [`valid_until`](Self::valid_until) once a renewal moved it past
    /// `after`, or with `None` once the lease is lost or released (never moves again). For a
    /// process that hands the deadline on, such as a watchdog that kills a command at
    /// `valid_until` unless told of a later one.
    ///
    /// # Cancel safety
    /// Cancel safe.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use std::time::Duration;
    /// let locks = leasehold::Locks::new(leasehold::stores::memory::MemoryStore::new());
    /// let guard = locks.lock("k")?.ttl(Duration::from_millis(300)).try_acquire().await?.expect("free");
    /// let first = guard.valid_until();
    /// let next = guard.valid_until_changed(first).await.expect("renewed");
    /// assert!(next > first);
    /// guard.release().await?;
    /// assert_eq!(guard.valid_until_changed(next).await, None);
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub async fn valid_until_changed(&self, after: Instant) -> Option<Instant> {
        loop {
            let changed = self.shared.state.changed();
            {
                let s = self.shared.state.borrow();
                if s.released || s.lost.is_some() {
                    return None;
                }
                if s.valid_until > after {
                    return Some(s.valid_until);
                }
            }
            changed.await;
        }
    }
}
