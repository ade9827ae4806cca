//! Checking fences where the work lands: [`FenceGate`] keeps the highest fence seen per key and
//! refuses writes under a lower one.
//!
//! A lease can end while its holder still acts — a pause (GC, SIGSTOP, a starved machine) longer
//! than the lease, a partition — and no lock can stop a holder that is not running. What stops
//! its late writes is the resource checking the fence each write carries: every grant's fence is
//! above every earlier grant's of the key, so a write under an older fence than one already seen
//! comes from a holder whose lease has ended. Writes under the same fence are one holder's.
//!
//! `FenceGate` is that check in memory, for a resource in one process (a service that owns the
//! data its workers send). A resource of its own (a database row, a Redis key) keeps the highest
//! fence beside the data and checks it in the same atomic step as the write; the documentation's
//! "Fencing your writes" page shows the SQL and the Redis script.
//!
//! ```
//! use leasehold::fence::FenceGate;
//! let gate = FenceGate::new();
//! gate.check("invoice/7", 41)?;                // the first holder writes under fence 41
//! gate.check("invoice/7", 42)?;                // the next holder's grant
//! let late = gate.check("invoice/7", 41).unwrap_err(); // the first, waking from a pause
//! assert_eq!((late.fence, late.highest), (41, 42));
//! gate.check("invoice/7", 42)?;                // the current holder writes on
//! # Ok::<(), leasehold::fence::Stale>(())
//! ```

use parking_lot::Mutex;
use std::collections::HashMap;

/// A write refused by a [`FenceGate`]: its fence is below one already seen for its key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stale fence {fence} for {key}: a write under fence {highest} was already accepted")]
pub struct Stale {
    /// The key written.
    pub key: String,
    /// The fence the write carried.
    pub fence: u64,
    /// The highest fence accepted for the key.
    pub highest: u64,
}

/// The highest fence accepted per key, in memory; cheap to share (`Arc`) between tasks.
#[derive(Debug, Default)]
pub struct FenceGate {
    highest: Mutex<HashMap<String, u64>>,
}

impl FenceGate {
    /// A gate that has seen no fence.
    pub fn new() -> Self {
        Self::default()
    }

    /// Accepts a write to `key` under `fence` — recording it as the key's highest — unless a
    /// higher fence was accepted for the key before.
    ///
    /// # Errors
    /// [`Stale`] when `fence` is below the key's highest: the writer's lease has ended.
    pub fn check(&self, key: &str, fence: u64) -> Result<(), Stale> {
        let mut all = self.highest.lock();
        match all.get_mut(key) {
            Some(h) if fence < *h => Err(Stale {
                key: key.to_owned(),
                fence,
                highest: *h,
            }),
            Some(h) => {
                *h = fence;
                Ok(())
            }
            None => {
                all.insert(key.to_owned(), fence);
                Ok(())
            }
        }
    }

    /// The highest fence accepted for `key`, if any.
    pub fn highest(&self, key: &str) -> Option<u64> {
        self.highest.lock().get(key).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_fenced_apart_and_equal_fences_pass() {
        let gate = FenceGate::new();
        assert!(gate.check("a", 10).is_ok());
        assert!(
            gate.check("b", 1).is_ok(),
            "another key has its own highest"
        );
        assert!(gate.check("a", 10).is_ok(), "the same grant writes on");
        assert_eq!(gate.check("a", 9).unwrap_err().highest, 10);
        assert_eq!((gate.highest("a"), gate.highest("c")), (Some(10), None));
    }
}
