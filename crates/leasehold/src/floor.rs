//! A store's floor: the cheapest correct raw operations that store is judged against, for
//! measuring (`leasehold bench --floor`, the benchmarks), not for locking.
//!
//! A floor takes a key and releases it with the least a correct lock on that store must send,
//! through the store's own connection, pool or HTTP transport, so that it pays the same client
//! costs as the store's lock path: Redis's fenced `SET NX PX` script and a compare-and-delete,
//! PostgreSQL's fenced upsert of the store's row, etcd's create-if-absent transaction and a
//! delete, a raw Kubernetes Lease create and delete, an object store's conditional create and
//! delete, the file store's `open(O_CREAT|O_EXCL)` and `unlink`. None of them judges expiry,
//! waits in line, renews or records anything an operator could read as a lease of leasehold's:
//! a floor's ratio says how much of its store's raw speed the lock keeps.
//!
//! Each store's floor is described on its page of the book and by [`Floor::describe`]; a store
//! that has none answers `None` to [`LockStore::floor`](crate::LockStore::floor).
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use leasehold::{memory::MemoryStore, Key, LockStore};
//! let floor = MemoryStore::new().floor().expect("the memory store has a floor");
//! let key = Key::new("k")?;
//! let taken = floor.take(&key).await?.expect("free");
//! assert!(floor.take(&key).await?.is_none(), "taken until released");
//! floor.release(&key, taken).await?;
//! floor.cycle(&key).await?; // take and release, the key free before and after
//! # Ok::<(), leasehold::Error>(()) }).unwrap();
//! ```

use crate::error::{Error, Result};
use crate::key::Key;
use async_trait::async_trait;
use std::fmt;
use std::time::Duration;

/// How long what a floor takes lives where the store expires it (Redis `PX`, PostgreSQL's
/// `expires`, etcd's session lease, a Lease's `leaseDurationSeconds`): as long as the leases
/// `leasehold bench` takes.
pub const TTL: Duration = Duration::from_secs(10);

/// What a floor's [`take`](Floor::take) took: the token, ETag, generation or file it holds, which
/// its [`release`](Floor::release) gives back. Opaque but for the store that made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken(String);

impl Taken {
    /// What the store needs to release it (a token, an ETag, a generation).
    pub fn new(what: impl Into<String>) -> Self {
        Taken(what.into())
    }

    /// What [`new`](Self::new) was given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The cheapest correct raw operations a store is judged against: for measuring, not locking.
///
/// Every method is one attempt, no retry: contention is an answer (`Ok(None)` from
/// [`take`](Self::take)), a store failure an error. Keys are the store's own names for them
/// (its prefix and naming), so a floor run on keys no lock uses touches nothing a lock holds.
#[async_trait]
pub trait Floor: Send + Sync + fmt::Debug {
    /// What the floor does, in a few words, without the store (`INCR + SET NX PX (one script),
    /// compare-and-delete (one script)`).
    fn describe(&self) -> String;

    /// Takes `key` if it is free: what to release it with, or `None` when it is taken.
    async fn take(&self, key: &Key) -> Result<Option<Taken>>;

    /// Releases what [`take`](Self::take) took.
    async fn release(&self, key: &Key, taken: Taken) -> Result<()>;

    /// One uncontended cycle: takes `key`, which must be free, and releases it. The default is
    /// [`take`](Self::take) then [`release`](Self::release); a store whose cheapest uncontended
    /// take skips what a contended one must do (an object store's read before its write) has
    /// its own.
    ///
    /// # Errors
    /// The store's errors, and [`Error::Store`] when `key` is taken.
    async fn cycle(&self, key: &Key) -> Result<()> {
        match self.take(key).await? {
            Some(taken) => self.release(key, taken).await,
            None => Err(not_free(&self.describe(), key)),
        }
    }

    /// The requests the store's transport has sent so far, its lock's and this floor's alike,
    /// where it counts them (the object stores' HTTP transport); `None` elsewhere.
    fn requests(&self) -> Option<u64> {
        None
    }
}

/// The error of an uncontended cycle that found its key taken.
pub(crate) fn not_free(floor: &str, key: &Key) -> Error {
    Error::Store {
        store: format!("floor ({floor})"),
        detail: format!(
            "{} is taken (an uncontended cycle needs a key nobody uses)",
            crate::key::display_key(key.as_str())
        ),
        retryable: false,
        source: None,
    }
}
