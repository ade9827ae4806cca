//! When a command run under a lease is stopped because the lease is failing or gone: the loss
//! grace (`--loss-grace`), the kill margin before the lease could expire, and the overlap window
//! (`--overlap-grace`).
//!
//! ```text
//! renew ✗ … stop-by ── SIGTERM ─────────── SIGKILL ─ margin ─ valid_until ─ drift ─ another may be granted
//!                      │◄── --loss-grace ──►│◄─ min(ttl/10, 1 s) ─►│
//! ```
//! The lease's own loss grace ([`leasehold::LockOptions::loss_grace`]) is `--loss-grace` plus the
//! kill margin, so it must fit `ttl/3 + loss grace + drift < ttl`; a `--loss-grace` that does not
//! is a usage error naming the largest that does. The command's group guard ([`crate::process::group_guard`])
//! is told each `valid_until` less half the margin, and kills the group then unless told of a
//! later one: a leasehold that is paused (SIGSTOP, a freeze) cannot stop its command itself.

use crate::exit::Failure;
use leasehold::{LockOptions, StopReason};
use std::time::Duration;
use tokio::time::Instant;

/// How a command is stopped when its lease is failing or gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loss {
    /// SIGTERM to SIGKILL when renewals fail.
    pub(crate) grace: Duration,
    /// SIGKILL goes this long before `valid_until`, for the group to be gone by then.
    pub(crate) kill_margin: Duration,
    /// SIGTERM to SIGKILL when the store says the lease is gone (zero: SIGKILL at once).
    pub(crate) overlap: Duration,
}

/// The kill margin of a lease of `ttl`: min(ttl/10, 1 s).
pub(crate) fn kill_margin(ttl: Duration) -> Duration {
    (ttl / 10).min(Duration::from_secs(1))
}

/// What a command's group guard is told for a lease valid until `valid_until` whose kill margin
/// is `margin`: half the margin before it.
pub(crate) fn watchdog(valid_until: Instant, margin: Duration) -> Instant {
    valid_until.checked_sub(margin / 2).unwrap_or(valid_until)
}

/// When SIGKILL must go for what runs under a lease to be gone by `deadline` (its
/// `valid_until`): `margin` before it; at or before now when that has passed (SIGKILL at once).
pub(crate) fn kill_before(deadline: Instant, margin: Duration) -> Instant {
    deadline.checked_sub(margin).unwrap_or_else(Instant::now)
}

impl Loss {
    /// The policy for a lease of `ttl` renewed every ttl/3, with the `--loss-grace` given (else
    /// the largest default that fits) and `--overlap-grace`; and the lease's loss grace to ask
    /// the library for.
    ///
    /// # Errors
    /// A usage error when `given` does not fit, naming the largest value that does.
    pub(crate) fn for_lease(
        ttl: Duration,
        given: Option<Duration>,
        overlap: Duration,
    ) -> Result<(Loss, Duration), Failure> {
        let mut opts = LockOptions::default();
        opts.ttl = ttl;
        let margin = kill_margin(ttl);
        let grace = match given {
            None => opts.loss_grace_period().saturating_sub(margin),
            Some(g) => {
                let max = opts.max_loss_grace().saturating_sub(margin);
                if g > max {
                    return Err(Failure::usage(format!(
                        "--loss-grace {} does not fit a {} lease: the command must be gone \
                         before the lease can expire, so it can have at most {} (renewed every \
                         TTL/3, {} drift margin, {} for SIGKILL); raise --ttl or lower --loss-grace",
                        humantime::format_duration(g),
                        humantime::format_duration(ttl),
                        humantime::format_duration(max),
                        humantime::format_duration(opts.drift()),
                        humantime::format_duration(margin),
                    )));
                }
                g
            }
        };
        Ok((
            Loss {
                grace,
                kill_margin: margin,
                overlap,
            },
            grace + margin,
        ))
    }

    /// When the command must have had SIGKILL, told to stop `why` while the lease was surely
    /// valid until `valid_until`; at or before now: SIGKILL at once, without a SIGTERM first.
    pub(crate) fn kill_at(&self, why: &StopReason, valid_until: Instant) -> Instant {
        let now = Instant::now();
        if why.is_gone() {
            return now + self.overlap;
        }
        let v = match why {
            StopReason::RenewalsFailing { valid_until } => *valid_until,
            _ => valid_until,
        };
        kill_before(v, self.kill_margin).min(now + self.grace)
    }

    /// What the command's group guard is told for `valid_until`: it kills the group then unless
    /// told of a later one.
    pub(crate) fn watchdog(&self, valid_until: Instant) -> Instant {
        watchdog(valid_until, self.kill_margin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_fit_every_ttl_and_a_grace_that_does_not_is_refused_naming_the_largest() {
        let (loss, lease) = Loss::for_lease(Duration::from_secs(2), None, Duration::ZERO).unwrap();
        assert_eq!(loss.kill_margin, Duration::from_millis(200));
        assert_eq!(lease.as_millis(), 655);
        assert_eq!(loss.grace.as_millis(), 455);
        let (loss, lease) = Loss::for_lease(Duration::from_secs(30), None, Duration::ZERO).unwrap();
        assert_eq!(
            (loss.kill_margin, lease.as_millis()),
            (Duration::from_secs(1), 9_849)
        );
        for ms in [10u64, 100, 2_000, 10_000, 30_000, 3_600_000] {
            let ttl = Duration::from_millis(ms);
            let (_, lease) = Loss::for_lease(ttl, None, Duration::ZERO).unwrap();
            let mut opts = LockOptions::default();
            opts.ttl = ttl;
            opts.loss_grace = Some(lease);
            assert!(opts.validate().is_ok(), "{ms}: {:?}", opts.validate());
        }
        let e = Loss::for_lease(
            Duration::from_secs(2),
            Some(Duration::from_secs(25)),
            Duration::ZERO,
        )
        .unwrap_err();
        assert_eq!(e.code, crate::exit::USAGE);
        assert!(e.message.contains("at most 1s 110ms"), "{}", e.message);
        let (_, lease) = Loss::for_lease(
            Duration::from_secs(2),
            Some(Duration::from_millis(1_110)),
            Duration::ZERO,
        )
        .unwrap();
        let mut opts = LockOptions::default();
        opts.ttl = Duration::from_secs(2);
        opts.loss_grace = Some(lease);
        assert!(opts.validate().is_ok());
    }
}
