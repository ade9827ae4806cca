//! A [`LockStore`] wrapper that puts a `tracing` span around every store call.
//!
//! [`crate::Locks`] wraps every store in it, so each call — acquire, renew, release, waiter
//! registration, inspect, list, force-release, cleanup, subscribe — runs inside a
//! `leasehold.store` span with `op`, `store` and `key` fields, and its failure is logged at debug
//! level. Without a subscriber the cost is a cached callsite check.

use crate::error::Result;
use crate::key::Key;
use crate::record::LeaseRecord;
use crate::store::{
    AcquireOutcome, AcquireRequest, Capabilities, ChangeWatch, CleanupProgress, CleanupReport,
    Inspection, LockStore, ReleaseOutcome, RenewOutcome,
};
use async_trait::async_trait;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

/// Wraps a store with spans; see the [module docs](self).
#[derive(Debug)]
pub struct Traced {
    inner: Arc<dyn LockStore>,
    name: String,
}

impl Traced {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn LockStore>) -> Self {
        let name = inner.describe();
        Traced { inner, name }
    }
}

async fn traced<T>(
    op: &'static str,
    store: &str,
    key: &str,
    fut: impl Future<Output = Result<T>>,
) -> Result<T> {
    let span = tracing::debug_span!("leasehold.store", op, store, key);
    let out = fut.instrument(span.clone()).await;
    if let Err(e) = &out {
        span.in_scope(
            || tracing::debug!(error = %e, retryable = e.is_retryable(), "store call failed"),
        );
    }
    out
}

#[async_trait]
impl LockStore for Traced {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn floor(&self) -> Option<std::sync::Arc<dyn crate::floor::Floor>> {
        self.inner.floor()
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        traced(
            "acquire",
            &self.name,
            req.key.as_str(),
            self.inner.acquire(req),
        )
        .await
    }

    async fn renew(&self, key: &Key, token: &str, ttl: Duration) -> Result<RenewOutcome> {
        traced(
            "renew",
            &self.name,
            key.as_str(),
            self.inner.renew(key, token, ttl),
        )
        .await
    }

    async fn release(&self, key: &Key, token: &str) -> Result<ReleaseOutcome> {
        traced(
            "release",
            &self.name,
            key.as_str(),
            self.inner.release(key, token),
        )
        .await
    }

    async fn withdraw_waiter(&self, key: &Key, token: &str) -> Result<()> {
        traced(
            "withdraw_waiter",
            &self.name,
            key.as_str(),
            self.inner.withdraw_waiter(key, token),
        )
        .await
    }

    async fn notify_release(&self, key: &Key, fence: Option<u64>) -> Result<bool> {
        traced(
            "notify_release",
            &self.name,
            key.as_str(),
            self.inner.notify_release(key, fence),
        )
        .await
    }

    async fn inspect(&self, key: &Key) -> Result<Option<Inspection>> {
        traced("inspect", &self.name, key.as_str(), self.inner.inspect(key)).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Inspection>> {
        traced("list", &self.name, prefix, self.inner.list(prefix)).await
    }

    async fn force_release(&self, key: &Key) -> Result<Option<LeaseRecord>> {
        traced(
            "force_release",
            &self.name,
            key.as_str(),
            self.inner.force_release(key),
        )
        .await
    }

    async fn force_release_holder(&self, key: &Key, holder: &str) -> Result<Option<LeaseRecord>> {
        traced(
            "force_release_holder",
            &self.name,
            key.as_str(),
            self.inner.force_release_holder(key, holder),
        )
        .await
    }

    async fn cleanup(
        &self,
        older_than: Duration,
        progress: &CleanupProgress,
    ) -> Result<CleanupReport> {
        let call = self.inner.cleanup(older_than, progress);
        traced("cleanup", &self.name, "", call).await
    }

    async fn subscribe(&self, key: &Key) -> Result<Option<Box<dyn ChangeWatch>>> {
        traced(
            "subscribe",
            &self.name,
            key.as_str(),
            self.inner.subscribe(key),
        )
        .await
    }
}
