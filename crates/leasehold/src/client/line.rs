//! A waiting acquisition's place in the key's line of waiters, and how long it leaves the store
//! alone for it.

use std::time::Duration;
use tokio::time::Instant;

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
pub(super) struct Line {
    /// The place last seen (0: next to be granted), and when.
    pub(super) place: Option<(usize, Instant)>,
    /// The holder's token last seen while first in line.
    holder: Option<String>,
    /// The fastest time one handoff took as the line moved, let go of slowly.
    pub(super) per_handoff: Option<Duration>,
    /// The least one handoff can take (two of the store's round trips, as last measured).
    least: Duration,
    /// Whether the key is a semaphore or a read-write lock (as last seen): one change of it can
    /// serve several waiters at once.
    pub(super) permit_key: bool,
}

impl Line {
    /// Takes note of standing at `place` (`None`: not in line) while `holder` holds the lease,
    /// after an attempt that took `rtt`; true when the backoff should start over (we moved up,
    /// or the lease changed hands while we are first in line).
    pub(super) fn seen(
        &mut self,
        place: Option<usize>,
        holder: Option<&str>,
        rtt: Duration,
    ) -> bool {
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

    /// How many of the key's change notifications a watching waiter may sleep through, and for
    /// how long at most, while the waiters ahead of it are served; `None` when it should look at
    /// the next one.
    ///
    /// Each release of a lock moves the line up by one, so a waiter at place `p` sleeps through
    /// `p − 1` of them. That count is a guess: a place that lapses or is given up without a
    /// notification moves the line unheard. So the sleep is also bounded by the time those
    /// ahead need at the line's fastest pace (`p` handoffs), and then it looks again. On a
    /// permit key one change can serve several waiters (a writer's release lets every reader
    /// in), and grants there are not announced: nothing is slept through.
    pub(super) fn skip(&self) -> Option<(usize, Duration)> {
        let (p, _) = self.place?;
        if self.permit_key || p < 2 {
            return None;
        }
        let per = self.per_handoff.unwrap_or(self.least);
        Some((p - 1, per * p as u32))
    }

    /// How long to leave the store alone while the waiters ahead of us are served (see the
    /// type); `None` when first or out of line.
    pub(super) fn behind_for(&self) -> Option<Duration> {
        let (p, _) = self.place?;
        let per = self.per_handoff.unwrap_or(self.least);
        (p > 0).then(|| per.mul_f64(p as f64 / 2.0))
    }
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

    /// A watching waiter at place `p` sleeps through `p − 1` changes, for no longer than `p`
    /// handoffs at the line's pace (a lapse moves the line unheard); on a permit key, through
    /// none.
    #[tokio::test(start_paused = true)]
    async fn a_watching_waiter_skips_changes_for_a_bounded_time_and_none_on_a_permit_key() {
        let mut line = Line::default();
        line.seen(Some(4), Some("h1"), 5 * MS);
        tokio::time::advance(100 * MS).await;
        line.seen(Some(3), Some("h2"), 5 * MS);
        // 100 ms a handoff, bounded at first by four times the least (40 ms).
        assert_eq!(line.skip(), Some((2, 120 * MS)));
        line.seen(Some(1), Some("h3"), 5 * MS);
        assert_eq!(
            line.skip(),
            None,
            "the next in line looks at the next change"
        );
        line.seen(Some(5), Some("h3"), 5 * MS);
        line.permit_key = true;
        assert_eq!(
            line.skip(),
            None,
            "a change of a permit key can serve several"
        );
    }
}
