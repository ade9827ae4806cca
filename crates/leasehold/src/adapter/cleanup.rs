//! What `cleanup` rests on: the check that the store refuses a stale conditional delete, and
//! the fence high-water mark that keeps fences above the records it deletes (see the parent
//! module's "Fences above a deleted record's").

use super::*;

/// The keys of the scratch records start with this: before its first delete, `cleanup` checks
/// on one that the store refuses a delete conditioned on a stale version, and deletes nothing
/// on a store that carries it out. A scratch record is free and deleted again at once; one left
/// behind (the process died meanwhile) is removed by a later `cleanup` like any free record.
pub const PROBE_PREFIX: &str = ".leasehold-probe/";

/// How many scratch records the delete check tries before it gives up on a store where each one
/// changed or vanished under it (other cleanups removing them).
const PROBE_ATTEMPTS: usize = 3;

impl<R: RecordStore> RecordLockStore<R> {
    /// Checks, once per adapter and before its first delete, that the store refuses a delete
    /// conditioned on a stale version: `cleanup` rests on it, since a record it judged removable
    /// may be granted again before its delete arrives. A server that ignores the precondition
    /// (some emulators, older S3-compatible servers) would delete the live lease.
    ///
    /// A success is kept; a failure is checked again at the next call.
    ///
    /// # Errors
    /// A non-retryable [`Error::Store`] naming the store when it carried out the stale delete;
    /// the store's errors; a retryable [`Error::Store`] when every scratch record changed or
    /// vanished before the check could conclude.
    pub(super) async fn check_conditional_delete(&self) -> Result<()> {
        self.delete_checked
            .get_or_try_init(|| self.probe_conditional_delete())
            .await
            .map(|_| ())
    }

    /// Creates a scratch record under [`PROBE_PREFIX`], replaces it (new bytes, so a new version
    /// on every store, ETags as MD5s included), then deletes it conditioned on the first
    /// version: the store must refuse, and the record must still be there as replaced. The
    /// scratch record is then deleted (best effort: a free record, which any later cleanup
    /// removes).
    async fn probe_conditional_delete(&self) -> Result<()> {
        for _ in 0..PROBE_ATTEMPTS {
            let key = Key::internal(format!("{PROBE_PREFIX}{:016x}", fastrand::u64(..)))?;
            let mut record = LeaseRecord::free(key.as_str(), 0);
            record.renewed_ms = self.now().ms;
            let Some(stale) = self.inner.create(&key, &record).await? else {
                continue; // the name is taken: draw another
            };
            record.renewed_ms = record.renewed_ms.saturating_add(1);
            let Some(current) = self.inner.replace(&key, &record, &stale).await? else {
                continue; // changed under us (another cleanup removed it)
            };
            if self.inner.delete(&key, &stale).await? {
                return Err(Error::Store {
                    store: self.inner.describe(),
                    detail: format!(
                        "the server ignores the precondition on DELETE: a delete conditioned on a stale version of the scratch record {key} was carried out, so cleanup deletes nothing on this store (a cleanup racing a grant could delete a live lease)"
                    ),
                    retryable: false,
                    source: None,
                });
            }
            // A refusal proves something only if the record is still there as replaced: a
            // "not found" because another cleanup removed it meanwhile does not.
            let kept = matches!(
                self.inner.get(&key).await?,
                Some(Stored::Record { version, .. }) if version == current
            );
            // A leftover scratch record is free; any later cleanup removes it.
            let _ = self.inner.delete(&key, &current).await;
            if kept {
                return Ok(());
            }
        }
        Err(Error::Store {
            store: self.inner.describe(),
            detail: format!(
                "cannot check that the server refuses a stale conditional delete: {PROBE_ATTEMPTS} scratch records changed or vanished under the check, so cleanup deletes nothing this time"
            ),
            retryable: true,
            source: None,
        })
    }
}

/// Whether `s` is the fence high-water record.
pub(super) fn is_high_water(s: &Stored) -> bool {
    matches!(s, Stored::Record { record, .. } if record.key == HIGH_WATER_KEY)
}

impl<R: RecordStore> RecordLockStore<R> {
    fn high_water_key() -> Result<Key> {
        Key::internal(HIGH_WATER_KEY)
    }

    /// The store's fence high-water mark: 0 when there is none.
    ///
    /// # Errors
    /// The store's errors; a non-retryable [`Error::Store`] when the record cannot be read and
    /// no fence can be salvaged from its bytes (no grant that needs it is made until it is
    /// repaired or deleted by hand).
    pub(super) async fn high_water(&self) -> Result<u64> {
        match self.inner.get(&Self::high_water_key()?).await? {
            None => Ok(0),
            Some(Stored::Record { record, .. }) => Ok(record.fence),
            Some(Stored::Corrupt {
                salvaged_fence: Some(f),
                ..
            }) => Ok(f),
            Some(Stored::Corrupt { detail, .. }) => Err(Error::Store {
                source: None,
                store: self.inner.describe(),
                detail: format!(
                    "the fence high-water record {HIGH_WATER_KEY} cannot be read ({detail}): no lease on a new record is granted until it is repaired"
                ),
                retryable: false,
            }),
        }
    }

    /// Raises the store's fence high-water mark to at least `fence`.
    pub(super) async fn raise_high_water(&self, fence: u64) -> Result<()> {
        let key = Self::high_water_key()?;
        for _ in 0..MAX_RACES {
            let done = match self.inner.get(&key).await? {
                None => {
                    let mark = LeaseRecord::free(HIGH_WATER_KEY, fence);
                    self.inner.create(&key, &mark).await?.is_some()
                }
                Some(Stored::Record { record, .. }) if record.fence >= fence => true,
                Some(Stored::Record {
                    mut record,
                    version,
                }) => {
                    record.fence = fence;
                    record.renewed_ms = self.now().ms;
                    self.inner.replace(&key, &record, &version).await?.is_some()
                }
                Some(Stored::Corrupt {
                    version,
                    salvaged_fence,
                    ..
                }) => {
                    let mark =
                        LeaseRecord::free(HIGH_WATER_KEY, fence.max(salvaged_fence.unwrap_or(0)));
                    self.inner.replace(&key, &mark, &version).await?.is_some()
                }
            };
            if done {
                return Ok(());
            }
        }
        Err(self.lost_races("writes of the fence high-water record"))
    }

    /// Floors the fence of the free record of `key` still marked unconfirmed at the high-water
    /// mark read now (after the marked write), and writes it without the marker (see the
    /// module documentation of the adapter): what a permit record is before its first grant.
    /// A marked lock grant whose lease is over (its granter died between the marked write and
    /// the confirming one, so it was never handed out) is freed in the same write; one still
    /// live is left to its granter.
    pub(super) async fn confirm_free(&self, key: &Key) -> Result<()> {
        for _ in 0..MAX_RACES {
            let Some(stored) = self.inner.get(key).await?.map(|s| self.resolve(s)) else {
                return Ok(());
            };
            let expiry = self.judge(key, Some(&stored));
            let Stored::Record { record, version } = stored else {
                return Ok(());
            };
            if !unconfirmed(&record) {
                return Ok(());
            }
            let now = self.now();
            let mut confirmed = match record.token {
                None => record,
                Some(_) if expiry.held(&record, now.ms) => return Ok(()),
                Some(_) => Rules {
                    now,
                    expiry,
                    fence_floor: 0,
                }
                .freed(&record),
            };
            confirmed.store.remove(UNCONFIRMED.0);
            confirmed.fence = confirmed.fence.max(self.high_water().await?);
            match self.inner.replace(key, &confirmed, &version).await? {
                Some(v) => {
                    self.written(key, v, confirmed);
                    return Ok(());
                }
                None => self.forget(key),
            }
        }
        Err(self.lost_races(&format!("conditional writes on {key}")))
    }

    /// Floors the grant `req` just wrote (with the unconfirmed marker) at the fence high-water
    /// mark read now, and writes it again without the marker: the grant, or, when somebody
    /// else's write took the record meanwhile, what the record holds now (the marked grant was
    /// never handed out).
    pub(super) async fn confirm_fence(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        let key = &req.key;
        let mut state = self.written.lock().get(key.as_str()).cloned();
        for _ in 0..MAX_RACES {
            let (version, record) = match state.take() {
                Some(s) => s,
                None => match self.inner.get(key).await?.map(|s| self.resolve(s)) {
                    Some(Stored::Record { record, version }) => (version, record),
                    Some(Stored::Corrupt { salvaged_fence, .. }) => {
                        let placeholder = decide::corrupt_placeholder(
                            key.as_str(),
                            salvaged_fence.unwrap_or(0),
                            self.now().ms,
                        );
                        return Ok(AcquireOutcome::Held(placeholder));
                    }
                    None => return Ok(AcquireOutcome::Held(LeaseRecord::free(key.as_str(), 0))),
                },
            };
            if record.token.as_deref() != Some(req.token.as_str()) {
                return Ok(AcquireOutcome::Held(record));
            }
            if !unconfirmed(&record) {
                return Ok(AcquireOutcome::Granted(record));
            }
            let floor = self.high_water().await?.checked_add(req.fences.max(1));
            let Some(floor) = floor else {
                return Err(Error::Store {
                    source: None,
                    store: self.inner.describe(),
                    detail: format!("the fence high-water record {HIGH_WATER_KEY} is at the largest fence: no fence above it can be granted"),
                    retryable: false,
                });
            };
            let mut confirmed = record;
            confirmed.store.remove(UNCONFIRMED.0);
            confirmed.fence = confirmed.fence.max(floor);
            match self.inner.replace(key, &confirmed, &version).await? {
                Some(v) => {
                    let written = self.written(key, v, confirmed);
                    return Ok(AcquireOutcome::Granted(written));
                }
                // Somebody wrote (a waiter joined, or the grant was taken over): read again.
                None => self.forget(key),
            }
        }
        Err(self.lost_races(&format!("conditional writes on {key}")))
    }
}
