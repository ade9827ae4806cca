//! The conformance suite: the contracts every [`LockStore`] keeps, as executable checks, for
//! authors of a store of their own (feature `conformance`; not needed to use leasehold).
//!
//! Each contract is a `pub async fn` taking the store as `Arc<dyn LockStore>` and panicking with
//! a message that says which contract broke. Each works under its own random key prefix, so all
//! of them can run against one store at once. TTLs are short (at most 2 s); where a contract must
//! wait for time (expiry) it sleeps only for the TTL. [`conformance_tests!`](crate::conformance_tests)
//! makes one `#[tokio::test]` per contract; a new contract added here runs on every store.
//!
//! The contracts: exclusion, reentry refused, expiry takeover, renewal, `lost()` on force release
//! and on takeover, monotonic fences and fence blocks, owner-only renew and release, idempotent
//! release, waiter handoff and withdrawal, labels read back whole, hostile keys, racing workers,
//! inspect/list/cleanup, `try_acquire` never waiting, release on drop, waiters not spinning,
//! local handoff, abandoned handoffs, cancelled acquisitions, release notifications, and, on
//! stores that keep a line of waiters, arrival order and a dead waiter skipped; on stores that
//! hold permits, semaphores and read-write locks (at most N holders, a writer alone, a waiting
//! writer first, lapsed permits back, one kind per key, one holder force-released), and on the
//! others a plain refusal of them.
//!
//! # Example
//!
//! A store of your own, checked in an integration test (`tests/conformance.rs`) of a crate with
//! `leasehold = { version = "…", features = ["conformance"] }` and tokio (`macros`,
//! `rt-multi-thread`) among its dev-dependencies:
//!
//! ```no_run
//! use leasehold::memory::MemoryStore;
//! use leasehold::LockStore;
//! use std::sync::Arc;
//!
//! // Each contract gets a store of its own here; sharing one works too.
//! fn store() -> Arc<dyn LockStore> {
//!     Arc::new(MemoryStore::new()) // your store instead
//! }
//!
//! leasehold::conformance_tests!(store());
//! # fn main() {}
//! ```

// The suite's checks panic by design: that is how a test reports a broken contract.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod fences;
mod handoff;
mod holding;
mod line;
mod permits;
mod records;
mod waiters;

pub use fences::*;
pub use handoff::*;
pub use holding::*;
pub use line::*;
pub use permits::*;
pub use records::*;
pub use waiters::*;

use crate::client::Locks;
use crate::error::Error;
use crate::guard::Released;
use crate::holder::HolderId;
use crate::key::Key;
use crate::store::{
    AcquireOutcome, AcquireRequest, Inspection, LockStore, LostReason, ReleaseOutcome, RenewOutcome,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MS: Duration = Duration::from_millis(1);

fn key(name: &str) -> Key {
    Key::new(prefix(name)).expect("test keys are valid")
}

/// A client acting as its own holder, with the local layer off so it talks to the store like
/// another process would.
pub fn client(store: &Arc<dyn LockStore>, holder: &str) -> Locks {
    Locks::from_arc(store.clone())
        .with_holder(HolderId::new(holder))
        .with_local_layer(false)
}

/// `holder` takes `k` at once, or the test fails saying why the key should have been free.
async fn take(
    store: &Arc<dyn LockStore>,
    holder: &str,
    k: &Key,
    why: &str,
) -> crate::guard::LeaseGuard {
    match client(store, holder)
        .lock_key(k.clone())
        .try_acquire()
        .await
    {
        Ok(Some(g)) => g,
        Ok(None) => {
            let found = store.inspect(k).await;
            panic!("{holder}: {k} should be {why}; the store has {found:?}")
        }
        Err(e) => panic!("{holder}: {e}"),
    }
}

async fn raw_acquire(
    store: &Arc<dyn LockStore>,
    k: &Key,
    holder: &str,
    ttl: Duration,
) -> (String, u64) {
    raw_acquire_block(store, k, holder, ttl, 1).await
}

/// [`raw_acquire`] reserving a block of `fences` fences; the fence returned is the block's last.
async fn raw_acquire_block(
    store: &Arc<dyn LockStore>,
    k: &Key,
    holder: &str,
    ttl: Duration,
    fences: u64,
) -> (String, u64) {
    let mut req = AcquireRequest::new(k.clone(), holder, ttl);
    req.fences = fences;
    match store.acquire(&req).await.expect("store acquire") {
        AcquireOutcome::Granted(r) => (req.token, r.fence),
        AcquireOutcome::Held(r) => panic!("expected {k} to be free, held by {:?}", r.holder),
    }
}

/// A random prefix for a test's keys: `t` and 8 hex digits, then `/name`.
pub fn prefix(name: &str) -> String {
    format!("t{:08x}/{name}", fastrand::u32(..))
}

/// Generates one `#[tokio::test]` per contract of [`conformance`](crate::conformance) for the
/// store made by `$make` (an expression, `.await` allowed, of type `Arc<dyn LockStore>`),
/// evaluated once per test.
///
/// The calling crate needs tokio with the `macros` and `rt-multi-thread` features.
///
/// # Example
/// ```no_run
/// mod memory {
///     leasehold::conformance_tests!(std::sync::Arc::new(leasehold::memory::MemoryStore::new()));
/// }
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@each $make;
            exclusion, reentry_is_refused, expiry_takeover, renewal_keeps_alive, lost_on_force_release,
            lost_on_takeover, fencing_is_monotonic, owner_only, idempotent_release, waiter_handoff,
            waiter_withdraws_on_timeout, hostile_keys, racing_workers, inspect_list_cleanup,
            try_acquire_never_waits, drop_releases, waiters_do_not_spin, fence_blocks,
            local_handoff, abandoned_handoff_is_released, cancelled_acquires_leave_nothing_taken,
            release_is_notified_when_asked, labels_are_read_back_whole,
            waiters_served_in_arrival_order, dead_waiter_is_skipped, semaphore_bounds_holders,
            read_write_excludes, one_kind_per_key, lapsed_permits_come_back,
            waiting_writer_blocks_new_readers, one_holder_is_force_released,
            release_grants_the_first_in_line, an_unclaimed_grant_lasts_only_its_place,
            a_waiter_that_leaves_passes_its_grant_on);
    };
    (@each $make:expr; $($name:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let store = $make;
                $crate::conformance::$name(store).await;
            }
        )*
    };
}
